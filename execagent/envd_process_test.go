package execagent

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// procStream is a Start or Connect stream and what it carried.
type procStream struct {
	*envdStream
	pid                 int
	stdout, stderr, pty strings.Builder
	keepalives          int
	end                 map[string]any // the end event
}

// startProc calls Start with the request JSON and reads its start event.
func startProc(t *testing.T, a *testAgent, req string, hdr ...string) *procStream {
	t.Helper()
	return firstEvent(t, openStream(t, a, "process.Process/Start", []string{req}, hdr...))
}

// connectProc calls Connect with the selector JSON and reads its start event.
func connectProc(t *testing.T, a *testAgent, selector string, hdr ...string) *procStream {
	t.Helper()
	return firstEvent(t, openStream(t, a, "process.Process/Connect", []string{`{"process":` + selector + `}`}, hdr...))
}

func firstEvent(t *testing.T, st *envdStream) *procStream {
	t.Helper()
	m := st.next()
	require.NotNil(t, m, "the stream ended before its start event: %v", st.end)
	pid, ok := get(m, "event", "start", "pid").(float64)
	require.True(t, ok, "the first event must be start{pid}, got %v", m)
	return &procStream{envdStream: st, pid: int(pid)}
}

// step reads one event; false after the end-of-stream message.
func (p *procStream) step() bool {
	p.t.Helper()
	m := p.next()
	if m == nil {
		return false
	}
	ev, _ := m["event"].(map[string]any)
	require.Len(p.t, ev, 1, "one event per message: %v", m)
	switch {
	case ev["data"] != nil:
		for k, v := range ev["data"].(map[string]any) {
			b, err := base64.StdEncoding.DecodeString(v.(string))
			require.NoError(p.t, err)
			map[string]*strings.Builder{"stdout": &p.stdout, "stderr": &p.stderr, "pty": &p.pty}[k].Write(b)
		}
	case ev["keepalive"] != nil:
		p.keepalives++
	case ev["end"] != nil:
		p.end = ev["end"].(map[string]any)
	default:
		require.Failf(p.t, "unexpected event", "%v", m)
	}
	return true
}

// until reads events until cond holds (failing at the stream's end).
func (p *procStream) until(cond func() bool, what string) {
	p.t.Helper()
	for !cond() {
		require.True(p.t, p.step(), "the stream ended before %s (stdout %q, pty %q)", what, p.stdout.String(), p.pty.String())
	}
}

// wait reads to the end-of-stream message and requires the end event.
func (p *procStream) wait() map[string]any {
	p.t.Helper()
	for p.step() {
	}
	require.Empty(p.t, p.endError(), "the stream ended in error: %v", p.envdStream.end)
	require.NotNil(p.t, p.end, "no end event")
	return p.end
}

// waitDeadline reads to the end-of-stream message and requires envd's end
// of a Start whose process was killed at its Connect-Timeout-Ms:
// deadline_exceeded, and no end event.
func (p *procStream) waitDeadline() {
	p.t.Helper()
	for p.step() {
	}
	require.Equal(p.t, connectDeadlineExceeded, p.endError(), "the stream's end: %v", p.envdStream.end)
	require.Nil(p.t, p.end, "an end event before deadline_exceeded")
}

func TestEnvd_Start_StreamsStartOutputAndEnd(t *testing.T) {
	a := newTestAgent(t, nil)
	w := a.cfg.Workdir
	require.NoError(t, os.Mkdir(filepath.Join(w, "sub"), 0o755))
	tests := []struct {
		name       string
		req        string
		wantStdout string
		wantStderr string
		wantEnd    string // the end event's JSON
	}{
		{name: "exit 0, stdout and stderr", req: `{"process":{"cmd":"/bin/sh","args":["-c","echo out; echo err >&2"]}}`,
			wantStdout: "out\n", wantStderr: "err\n", wantEnd: `{"exited":true,"status":"exit status 0"}`},
		{name: "exit 3", req: `{"process":{"cmd":"/bin/sh","args":["-c","exit 3"]}}`,
			wantEnd: `{"exitCode":3,"exited":true,"status":"exit status 3","error":"exit status 3"}`},
		{name: "killed", req: `{"process":{"cmd":"/bin/sh","args":["-c","kill -9 $$"]}}`,
			wantEnd: `{"exitCode":-1,"status":"signal: killed","error":"signal: killed"}`},
		{name: "cwd and HOME default to the workdir", req: `{"process":{"cmd":"/bin/sh","args":["-c","pwd; echo $HOME"]}}`,
			wantStdout: w + "\n" + w + "\n", wantEnd: `{"exited":true,"status":"exit status 0"}`},
		{name: "a relative cwd, envs", req: `{"process":{"cmd":"/bin/sh","args":["-c","pwd; echo $FOO"],"envs":{"FOO":"bar"},"cwd":"sub"}}`,
			wantStdout: w + "/sub\nbar\n", wantEnd: `{"exited":true,"status":"exit status 0"}`},
		{name: "~ and HOME set by the request", req: `{"process":{"cmd":"/bin/sh","args":["-c","pwd; echo $HOME"],"envs":{"HOME":"/h"},"cwd":"~/sub"}}`,
			wantStdout: w + "/sub\n/h\n", wantEnd: `{"exited":true,"status":"exit status 0"}`},
		{name: "the user named is ignored", req: `{"process":{"cmd":"/bin/sh","args":["-c","id -u"]}}`,
			wantStdout: strconv.Itoa(os.Getuid()) + "\n", wantEnd: `{"exited":true,"status":"exit status 0"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startProc(t, a, tt.req, "X-Quarry-Envd-User: someone", "Keepalive-Ping-Interval: 50")
			assert.Positive(t, p.pid)
			end := p.wait()
			assert.Equal(t, tt.wantStdout, p.stdout.String())
			assert.Equal(t, tt.wantStderr, p.stderr.String())
			b, _ := json.Marshal(end)
			assert.JSONEq(t, tt.wantEnd, string(b))
		})
	}
}

func TestEnvd_Start_RefusalsEndTheStream(t *testing.T) {
	a := newTestAgent(t, nil)
	tests := []struct {
		name, req string
		hdr       []string
		wantCode  string
	}{
		{name: "no cmd", req: `{"process":{"args":["x"]}}`, wantCode: connectInvalidArgument},
		{name: "a cwd that is not there", req: `{"process":{"cmd":"/bin/true","cwd":"/no/such/dir"}}`, wantCode: connectInvalidArgument},
		{name: "a program that is not there", req: `{"process":{"cmd":"/no/such/program"}}`, wantCode: connectInvalidArgument},
		{name: "a bad timeout", req: `{"process":{"cmd":"/bin/true"}}`, hdr: []string{"Connect-Timeout-Ms: soon"}, wantCode: connectInvalidArgument},
		{name: "a pty too large", req: `{"process":{"cmd":"/bin/sh"},"pty":{"size":{"cols":5000,"rows":5}}}`, wantCode: connectInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := openStream(t, a, "process.Process/Start", []string{tt.req}, tt.hdr...)
			assert.Nil(t, st.next(), "no start event")
			assert.Equal(t, tt.wantCode, st.endError(), "%v", st.end)
		})
	}
	st := openStream(t, a, "process.Process/Start", nil)
	assert.Equal(t, connectInvalidArgument, st.endError(), "a stream without its request message")
	st = openStream(t, a, "process.Process/Start", []string{`{"process":{"cmd":"/bin/true"}}`, `{}`})
	assert.Nil(t, st.next())
	assert.Equal(t, connectInvalidArgument, st.endError(), "a server stream's request with two messages")
}

// Connect-Timeout-Ms bounds the process: it is killed at the deadline.
func TestEnvd_Start_ConnectTimeoutKillsTheProcess(t *testing.T) {
	a := newTestAgent(t, nil)
	began := time.Now()
	p := startProc(t, a, `{"process":{"cmd":"/bin/sh","args":["-c","echo before; sleep 30"]}}`, "Connect-Timeout-Ms: 400")
	p.waitDeadline()
	assert.Less(t, time.Since(began), 10*time.Second)
	assert.Equal(t, "before\n", p.stdout.String(), "the output before the deadline comes first")
	eventually(t, func() bool { return processDead(p.pid) }, "the process is gone")
	// Connect, after the kill, gets the end event.
	end := connectProc(t, a, fmt.Sprintf(`{"pid":%d}`, p.pid)).wait()
	assert.Equal(t, "signal: killed", end["status"])
	assert.EqualValues(t, -1, end["exitCode"])
}

// A client that disconnects leaves the process running; output nobody
// subscribes to is discarded; Connect gets what comes after, and the end.
func TestEnvd_DisconnectKeepsTheProcess_ConnectGetsWhatFollows(t *testing.T) {
	a := newTestAgent(t, nil)
	p := startProc(t, a, `{"process":{"cmd":"/bin/sh","args":["-c","echo early; read x; echo unseen; read y; echo late:$y"]}}`)
	p.until(func() bool { return p.stdout.String() == "early\n" }, "early")
	sel := fmt.Sprintf(`{"pid":%d}`, p.pid)
	ep, err := a.srv.envdProcs.find(&pbProcessSelector{PID: ptrTo(pbUint32(p.pid))}, false)
	require.NoError(t, err)
	p.close()
	began := time.Now()
	eventually(t, func() bool { ep.mu.Lock(); defer ep.mu.Unlock(); return len(ep.subs) == 0 }, "the agent sees the disconnect")
	assert.Less(t, time.Since(began), 5*time.Second, "at once, not at the next keepalive")
	rpcOK(t, a, "process.Process/SendInput", `{"process":`+sel+`,"input":{"stdin":"`+b64("1\n")+`"}}`)
	list := rpcOK(t, a, "process.Process/List", `{}`)
	assert.Contains(t, fmt.Sprint(list), fmt.Sprintf("pid:%d", p.pid), "it still runs: %v", list)
	// "unseen" is read from the process with no subscriber before Connect.
	eventually(t, func() bool { return ep.published.Load() >= int64(len("early\nunseen\n")) }, "the agent reads unseen")
	c := connectProc(t, a, sel)
	assert.Equal(t, p.pid, c.pid)
	rpcOK(t, a, "process.Process/SendInput", `{"process":`+sel+`,"input":{"stdin":"`+b64("2\n")+`"}}`)
	end := c.wait()
	assert.Equal(t, "late:2\n", c.stdout.String(), "the output before Connect is not replayed")
	assert.Equal(t, true, end["exited"])
}

// An exited process stays connectable by pid and tag: start, then its end.
func TestEnvd_Connect_AfterTheExit_ByPidAndTag(t *testing.T) {
	a := newTestAgent(t, nil)
	p := startProc(t, a, `{"process":{"cmd":"/bin/sh","args":["-c","exit 7"]},"tag":"job-1"}`)
	p.wait()
	for _, sel := range []string{fmt.Sprintf(`{"pid":%d}`, p.pid), `{"tag":"job-1"}`} {
		c := connectProc(t, a, sel)
		assert.Equal(t, p.pid, c.pid)
		end := c.wait()
		assert.EqualValues(t, 7, end["exitCode"], sel)
	}
	status, out := rpc(t, a, "process.Process/SendInput", fmt.Sprintf(`{"process":{"pid":%d},"input":{"stdin":"eA=="}}`, p.pid))
	assert.Equal(t, http.StatusNotFound, status, "input goes to running processes only: %v", out)
	st := openStream(t, a, "process.Process/Connect", []string{`{"process":{"pid":999999}}`})
	assert.Nil(t, st.next())
	assert.Equal(t, connectNotFound, st.endError())
}

// Exited processes are forgotten after envdExitRetention, and beyond
// envdMaxRetained, oldest first.
func TestEnvdProcTable_RetentionIsBoundedInTimeAndCount(t *testing.T) {
	a := newTestAgent(t, nil)
	tbl := newEnvdProcTable(a.srv)
	exit := func(pid int) *envdProc {
		require.NoError(t, tbl.reserve())
		ep := newEnvdProc(pbProcessConfig{Cmd: "x"}, nil)
		ep.pid = pid
		tbl.add(ep)
		tbl.finish(ep, endEvent(0, ""), false)
		return ep
	}
	pid := func(n int) *pbProcessSelector { v := pbUint32(n); return &pbProcessSelector{PID: &v} }
	for n := 1; n <= envdMaxRetained+1; n++ {
		exit(n)
	}
	_, err := tbl.find(pid(1), true)
	assert.ErrorIs(t, err, errNotFound, "the oldest is forgotten past the count")
	_, err = tbl.find(pid(2), true)
	require.NoError(t, err)
	tbl.mu.Lock()
	tbl.pruneLocked(time.Now().Add(envdExitRetention))
	left, running := len(tbl.byPID), tbl.running
	tbl.mu.Unlock()
	assert.Zero(t, left, "all are forgotten after the retention")
	assert.Zero(t, running)
}

// stdin: a pipe unless stdin is false; SendInput, StreamInput, CloseStdin.
func TestEnvd_Stdin_SendInputStreamInputAndClose(t *testing.T) {
	a := newTestAgent(t, nil)
	p := startProc(t, a, `{"process":{"cmd":"/bin/cat"}}`)
	sel := fmt.Sprintf(`{"pid":%d}`, p.pid)
	rpcOK(t, a, "process.Process/SendInput", `{"process":`+sel+`,"input":{"stdin":"`+b64("abc")+`"}}`)
	in := openStream(t, a, "process.Process/StreamInput", []string{
		`{"start":{"process":` + sel + `}}`,
		`{"data":{"input":{"stdin":"` + b64("def") + `"}}}`,
		`{"keepalive":{}}`,
		`{"data":{"input":{"stdin":"` + b64("ghi") + `"}}}`,
	})
	assert.Equal(t, map[string]any{}, in.next(), "StreamInput answers one empty message")
	assert.Empty(t, in.endError())
	rpcOK(t, a, "process.Process/CloseStdin", `{"process":`+sel+`}`)
	p.wait()
	assert.Equal(t, "abcdefghi", p.stdout.String())

	bad := openStream(t, a, "process.Process/StreamInput", []string{`{"data":{"input":{"stdin":"eA=="}}}`})
	assert.Nil(t, bad.next())
	assert.Equal(t, connectInvalidArgument, bad.endError(), "data before start")

	q := startProc(t, a, `{"process":{"cmd":"/bin/sh","args":["-c","sleep 30"]},"stdin":false}`)
	qsel := fmt.Sprintf(`{"pid":%d}`, q.pid)
	status, out := rpc(t, a, "process.Process/SendInput", `{"process":`+qsel+`,"input":{"stdin":"eA=="}}`)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Equal(t, connectFailedPrecondition, out["code"], "%v", out)
	status, out = rpc(t, a, "process.Process/SendInput", `{"process":`+qsel+`,"input":{"pty":"eA=="}}`)
	assert.Equal(t, connectFailedPrecondition, out["code"], "pty input to a process without one: %d %v", status, out)
	rpcOK(t, a, "process.Process/CloseStdin", `{"process":`+qsel+`}`) // no stdin: nothing to close
	rpcOK(t, a, "process.Process/SendSignal", `{"process":`+qsel+`,"signal":"SIGNAL_SIGKILL"}`)
	q.wait()
}

func TestEnvd_SendSignal_TermKillAndOthers(t *testing.T) {
	a := newTestAgent(t, nil)
	p := startProc(t, a, `{"process":{"cmd":"/bin/sh","args":["-c","sleep 30"]}}`)
	sel := fmt.Sprintf(`{"pid":%d}`, p.pid)
	status, out := rpc(t, a, "process.Process/SendSignal", `{"process":`+sel+`,"signal":"SIGNAL_UNSPECIFIED"}`)
	assert.Equal(t, http.StatusNotImplemented, status, "%v", out)
	rpcOK(t, a, "process.Process/SendSignal", `{"process":`+sel+`,"signal":"SIGNAL_SIGTERM"}`)
	end := p.wait()
	assert.Equal(t, "signal: terminated", end["status"])
	status, _ = rpc(t, a, "process.Process/SendSignal", `{"process":`+sel+`,"signal":"SIGNAL_SIGKILL"}`)
	assert.Equal(t, http.StatusNotFound, status, "an exited process is not found (the SDK's kill answers False)")
}

// List answers the running processes with their config and tag.
func TestEnvd_List_RunningProcesses(t *testing.T) {
	a := newTestAgent(t, nil)
	p := startProc(t, a, `{"process":{"cmd":"/bin/sh","args":["-c","sleep 30"],"envs":{"A":"1"},"cwd":"/tmp"},"tag":"srv"}`)
	q := startProc(t, a, `{"process":{"cmd":"/bin/sh","args":["-c","exit 0"]}}`)
	q.wait()
	list := rpcOK(t, a, "process.Process/List", `{}`)
	want := fmt.Sprintf(`{"processes":[{"config":{"cmd":"/bin/sh","args":["-c","sleep 30"],"envs":{"A":"1"},"cwd":"/tmp"},"pid":%d,"tag":"srv"}]}`, p.pid)
	b, _ := json.Marshal(list)
	assert.JSONEq(t, want, string(b))
	rpcOK(t, a, "process.Process/SendSignal", fmt.Sprintf(`{"process":{"tag":"srv"},"signal":"SIGNAL_SIGKILL"}`))
	p.wait()
	assert.Equal(t, map[string]any{}, rpcOK(t, a, "process.Process/List", `{}`))
}

// Keepalive events come at Keepalive-Ping-Interval on a quiet stream.
func TestEnvd_Start_KeepaliveAtTheAskedInterval(t *testing.T) {
	a := newTestAgent(t, nil)
	p := startProc(t, a, `{"process":{"cmd":"/bin/sh","args":["-c","sleep 2.5"]}}`, "Keepalive-Ping-Interval: 1")
	p.wait()
	assert.GreaterOrEqual(t, p.keepalives, 1)
}

// A PTY: data{pty}, the size asked for, Update resizes, pty input.
func TestEnvd_PTY_SizeResizeInputAndEnd(t *testing.T) {
	a := newTestAgent(t, nil)
	p := startProc(t, a, `{"process":{"cmd":"/bin/sh","args":["-c","stty size; read a; stty size; read b; echo got:$b"],"envs":{"TERM":"xterm"}},"pty":{"size":{"cols":100,"rows":30}}}`)
	sel := fmt.Sprintf(`{"pid":%d}`, p.pid)
	p.until(func() bool { return strings.Contains(p.pty.String(), "30 100") }, "the first size")
	rpcOK(t, a, "process.Process/Update", `{"process":`+sel+`,"pty":{"size":{"cols":120,"rows":40}}}`)
	rpcOK(t, a, "process.Process/SendInput", `{"process":`+sel+`,"input":{"pty":"`+b64("\n")+`"}}`)
	p.until(func() bool { return strings.Contains(p.pty.String(), "40 120") }, "the new size")
	status, out := rpc(t, a, "process.Process/CloseStdin", `{"process":`+sel+`}`)
	assert.Equal(t, connectFailedPrecondition, out["code"], "a pty has no stdin to close: %d", status)
	status, out = rpc(t, a, "process.Process/SendInput", `{"process":`+sel+`,"input":{"stdin":"eA=="}}`)
	assert.Equal(t, connectFailedPrecondition, out["code"], "stdin to a pty: %d", status)
	rpcOK(t, a, "process.Process/SendInput", `{"process":`+sel+`,"input":{"pty":"`+b64("hello\n")+`"}}`)
	end := p.wait()
	assert.Contains(t, p.pty.String(), "got:hello")
	assert.Equal(t, true, end["exited"])
	assert.Empty(t, p.stdout.String(), "a pty's output is data{pty}")
}

// A PTY's Connect-Timeout-Ms kills it too.
func TestEnvd_PTY_ConnectTimeoutKills(t *testing.T) {
	a := newTestAgent(t, nil)
	p := startProc(t, a, `{"process":{"cmd":"/bin/sh","args":["-c","sleep 30"]},"pty":{"size":{"cols":80,"rows":24}}}`, "Connect-Timeout-Ms: 400")
	p.waitDeadline()
	end := connectProc(t, a, fmt.Sprintf(`{"pid":%d}`, p.pid)).wait()
	assert.Equal(t, "signal: killed", end["status"])
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// Running envd processes are bounded by MaxProcesses; an exited one frees
// its room.
func TestEnvd_Start_BoundedByMaxProcesses(t *testing.T) {
	a := newTestAgent(t, func(c *Config) { c.MaxProcesses = 1 })
	p := startProc(t, a, `{"process":{"cmd":"/bin/sh","args":["-c","sleep 30"]}}`)
	st := openStream(t, a, "process.Process/Start", []string{`{"process":{"cmd":"/bin/true"}}`})
	assert.Nil(t, st.next())
	assert.Equal(t, connectResourceExhausted, st.endError())
	rpcOK(t, a, "process.Process/SendSignal", fmt.Sprintf(`{"process":{"pid":%d},"signal":"SIGNAL_SIGKILL"}`, p.pid))
	p.wait()
	startProc(t, a, `{"process":{"cmd":"/bin/true"}}`).wait()
}
