package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// leaveDeadline is how soon after its client left a stream's call must
// end: the bound (the gateway peeks every 250 ms).
const leaveDeadline = 2 * time.Second

// inflight counts an agent's requests in flight by path.
type inflight struct {
	mu sync.Mutex
	n  map[string]int
}

func (f *inflight) add(path string, d int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n[path] += d
}

// count returns how many requests whose path ends with suffix are in flight.
func (f *inflight) count(suffix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for p, c := range f.n {
		if strings.HasSuffix(p, suffix) {
			n += c
		}
	}
	return n
}

// startCountedAgent runs a real agent whose requests in flight are counted;
// it is closed when the test ends.
func startCountedAgent(t *testing.T) (*testAgent, *inflight) {
	t.Helper()
	f := &inflight{n: map[string]int{}}
	agent := startAgentWrapped(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			f.add(r.URL.Path, 1)
			defer f.add(r.URL.Path, -1)
			h.ServeHTTP(w, r)
		})
	})
	return agent, f
}

// rawStream sends one request on a connection of its own (the client whose
// leaving the test stages) and returns the connection.
func rawStream(t *testing.T, gwURL, method, path string, body any) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(gwURL, "http://"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	var b []byte
	if body != nil {
		b, err = json.Marshal(body)
		require.NoError(t, err)
	}
	_, err = fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nAccept: text/event-stream\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		method, path, testKey, len(b), b)
	require.NoError(t, err)
	return conn
}

// firstEvent reads the answer's head and its first event from conn.
func firstEvent(t *testing.T, conn net.Conn) sseEvent {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(testDeadline)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ev, ok := <-readEvents(resp.Body)
	require.True(t, ok, "the stream ended before its first event")
	return ev
}

// sleepCommand prints (or, with a file, writes to it) its pid, then is
// `sleep 4242` under that pid.
func sleepCommand(pidFile string) string {
	if pidFile == "" {
		return `sh -c 'echo $$; exec sleep 4242'`
	}
	return `sh -c 'echo $$ > ` + pidFile + `; exec sleep 4242'`
}

// isSleep4242 reports whether pid is a live (not zombie) `sleep 4242`.
func isSleep4242(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	if i := bytes.LastIndexByte(stat, ')'); i < 0 || bytes.HasPrefix(stat[i+1:], []byte(" Z")) {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && string(cmdline) == "sleep\x004242\x00"
}

// within polls cond for at most d and reports whether it held.
func within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// A client that leaves a stream tied to a command ends its call within
// leaveDeadline, as JSON calls do: a streamed exec or session run kills its
// command, a followed output stops following (the process runs on). The
// agent's own keep-alives (15 s) are what the gateway waited for before.
func TestProxy_ClientLeavingAStreamEndsItsCall_RealAgent(t *testing.T) {
	tests := []struct {
		name string
		// start starts the call on conn's stream and returns the pid of its
		// sleep 4242 and the agent path suffix of the call.
		start func(t *testing.T, gwURL string, agent *testAgent) (conn net.Conn, pid int, route string)
		// killed: the call's end kills the sleep (else it must run on).
		killed bool
	}{
		{
			name:   "exec event stream",
			killed: true,
			start: func(t *testing.T, gwURL string, _ *testAgent) (net.Conn, int, string) {
				conn := rawStream(t, gwURL, http.MethodPost, "/v1/sandboxes/sbx-1/exec",
					agentapi.ExecRequest{Command: sleepCommand(""), TimeoutMS: 600000})
				ev := firstEvent(t, conn)
				require.Equal(t, agentapi.EventStdout, ev.name)
				return conn, pidOfChunk(t, ev.data), "/exec"
			},
		},
		{
			name:   "session run asking for a stream",
			killed: true,
			start: func(t *testing.T, gwURL string, agent *testAgent) (net.Conn, int, string) {
				resp, body := callJSON(t, http.MethodPost, gwURL+"/v1/sandboxes/sbx-1/sessions", testKey, agentapi.SessionCreateRequest{})
				require.Equal(t, http.StatusCreated, resp.StatusCode, "body %s", body)
				sid := decode[agentapi.SessionInfo](t, body).ID
				pidFile := filepath.Join(agent.Workdir, "run.pid")
				conn := rawStream(t, gwURL, http.MethodPost, "/v1/sandboxes/sbx-1/sessions/"+sid+"/run",
					agentapi.SessionRunRequest{Command: sleepCommand(pidFile), TimeoutMS: 600000})
				return conn, readPID(t, pidFile), "/run"
			},
		},
		{
			name:   "followed process output",
			killed: false,
			start: func(t *testing.T, gwURL string, _ *testAgent) (net.Conn, int, string) {
				resp, body := callJSON(t, http.MethodPost, gwURL+"/v1/sandboxes/sbx-1/processes", testKey,
					agentapi.ProcessStartRequest{Command: sleepCommand("")})
				require.Less(t, resp.StatusCode, 300, "body %s", body)
				proc := decode[agentapi.ProcessInfo](t, body)
				conn := rawStream(t, gwURL, http.MethodGet, "/v1/sandboxes/sbx-1/processes/"+proc.ID+"/output?follow=true", nil)
				ev := firstEvent(t, conn)
				require.Equal(t, agentapi.EventOutput, ev.name)
				return conn, pidOfChunk(t, ev.data), "/output"
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			agent, calls := startCountedAgent(t)
			mgr := newFakeManager(agent.URL)
			mgr.addLease("sbx-1", testKey, agent.URL, 1)
			gw := startGateway(t, mgr, nil)

			began := time.Now()
			conn, pid, route := tt.start(t, gw.URL, agent)
			eventually(t, func() bool { return isSleep4242(pid) }, fmt.Sprintf("pid %d becomes the call's sleep 4242", pid))
			require.Equal(t, 1, calls.count(route), "the agent serves the call")
			time.Sleep(time.Until(began.Add(time.Second)))
			require.NoError(t, conn.Close())

			left := time.Now()
			assert.True(t, within(leaveDeadline, func() bool { return calls.count(route) == 0 }),
				"the agent still serves the call %s after its client left", time.Since(left))
			if tt.killed {
				assert.True(t, within(leaveDeadline-time.Since(left), func() bool { return !isSleep4242(pid) }),
					"sleep 4242 (pid %d) still runs %s after its client left", pid, time.Since(left))
			} else {
				assert.True(t, isSleep4242(pid), "a followed process runs on when its follower leaves")
			}
			assert.Empty(t, mgr.Calls("CheckTask"), "a stream its client left is no agent failure")
		})
	}
}

// pidOfChunk reads the pid a command printed from an output event's data.
func pidOfChunk(t *testing.T, data string) int {
	t.Helper()
	var c agentapi.StreamChunk
	require.NoError(t, json.Unmarshal([]byte(data), &c), "data %s", data)
	pid, err := strconv.Atoi(strings.TrimSpace(c.Data))
	require.NoError(t, err, "the first output is the pid: %q", c.Data)
	return pid
}

// readPID waits for a command to write its pid to path.
func readPID(t *testing.T, path string) int {
	t.Helper()
	var pid int
	eventually(t, func() bool {
		b, err := os.ReadFile(path)
		if err != nil || !bytes.HasSuffix(b, []byte("\n")) {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	}, "the command writes its pid to "+path)
	return pid
}
