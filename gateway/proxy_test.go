package gateway

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/warmpool"
)

// withAgent serves a gateway whose lease sbx-1 (of testKey) reaches a real agent.
func withAgent(t *testing.T, mutate func(*Config)) (*testGateway, *testAgent, *fakeManager) {
	t.Helper()
	agent := startAgent(t)
	mgr := newFakeManager(agent.URL)
	mgr.addLease("sbx-1", testKey, agent.URL, 1)
	return startGateway(t, mgr, mutate), agent, mgr
}

func TestProxy_ExecAndSessions_RealAgent(t *testing.T) {
	gw, _, _ := withAgent(t, nil)
	base := gw.URL + "/v1/sandboxes/sbx-1"

	resp, body := callJSON(t, http.MethodPost, base+"/exec", testKey, agentapi.ExecRequest{Command: "echo hi; echo err >&2; exit 3"})
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	res := decode[agentapi.ExecResult](t, body)
	assert.Equal(t, 3, res.ExitCode)
	assert.Equal(t, "hi\n", res.Stdout)
	assert.Equal(t, "err\n", res.Stderr)

	resp, body = callJSON(t, http.MethodPost, base+"/sessions", testKey, agentapi.SessionCreateRequest{})
	require.Equal(t, http.StatusCreated, resp.StatusCode, "the agent's status passes through; body %s", body)
	ses := decode[agentapi.SessionInfo](t, body)

	resp, body = callJSON(t, http.MethodPost, base+"/sessions/"+ses.ID+"/run", testKey, agentapi.SessionRunRequest{Command: "cd /tmp && export X=1"})
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	resp, body = callJSON(t, http.MethodPost, base+"/sessions/"+ses.ID+"/run", testKey, agentapi.SessionRunRequest{Command: `echo "$X $PWD"`, TimeoutMS: 5000})
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	assert.Equal(t, "1 /tmp\n", decode[agentapi.SessionRunResult](t, body).Output)

	resp, body = call(t, http.MethodGet, base+"/sessions", testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Len(t, decode[agentapi.SessionList](t, body).Sessions, 1)

	resp, body = call(t, http.MethodDelete, base+"/sessions/"+ses.ID, testKey, nil)
	require.Less(t, resp.StatusCode, 300, "body %s", body)

	resp, body = callJSON(t, http.MethodPost, base+"/processes", testKey, agentapi.ProcessStartRequest{Command: "echo out; sleep 0.1"})
	require.Less(t, resp.StatusCode, 300, "body %s", body)
	proc := decode[agentapi.ProcessInfo](t, body)
	eventually(t, func() bool {
		_, body := call(t, http.MethodGet, base+"/processes/"+proc.ID, testKey, nil)
		return decode[agentapi.ProcessInfo](t, body).State == agentapi.ProcessExited
	}, "the process exits")
	resp, body = call(t, http.MethodGet, base+"/processes/"+proc.ID+"/output?offset=0", testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	assert.Equal(t, "out\n", decode[agentapi.ProcessOutput](t, body).Data)
}

// The gateway streams follow=... exactly when the agent does: any
// strconv.ParseBool form of true.
func TestProxy_ProcessOutputFollowStreams_RealAgent(t *testing.T) {
	gw, agent, _ := withAgent(t, nil)
	base := gw.URL + "/v1/sandboxes/sbx-1"
	for i, follow := range []string{"true", "1", "t", "TRUE"} {
		t.Run(follow, func(t *testing.T) {
			mark := fmt.Sprintf("go-%d", i)
			resp, body := callJSON(t, http.MethodPost, base+"/processes", testKey,
				agentapi.ProcessStartRequest{Command: "echo one; while [ ! -e " + mark + " ]; do sleep 0.02; done; echo two"})
			require.Less(t, resp.StatusCode, 300, "body %s", body)
			proc := decode[agentapi.ProcessInfo](t, body)

			sresp := openStream(t, http.MethodGet, base+"/processes/"+proc.ID+"/output?follow="+follow, nil)
			require.Equal(t, http.StatusOK, sresp.StatusCode)
			events := readEvents(sresp.Body)
			ev := <-events
			require.Equal(t, agentapi.EventOutput, ev.name)
			assert.Contains(t, ev.data, "one", "the first event arrives while the process runs")
			require.NoError(t, os.WriteFile(filepath.Join(agent.Workdir, mark), nil, 0o600))
			var out strings.Builder
			var last string
			for ev := range events {
				last = ev.name
				if ev.name == agentapi.EventOutput {
					out.WriteString(ev.data)
				}
			}
			assert.Contains(t, out.String(), "two")
			assert.Equal(t, agentapi.EventExit, last)
		})
	}
}

func TestProxy_AgentErrorsPassThrough_RealAgent(t *testing.T) {
	gw, _, _ := withAgent(t, nil)
	base := gw.URL + "/v1/sandboxes/sbx-1"
	tests := []struct {
		name   string
		method string
		path   string
		body   any
		status int
		code   string
	}{
		{name: "unknown session", method: http.MethodPost, path: "/sessions/ses-none/run", body: agentapi.SessionRunRequest{Command: "true"}, status: 404, code: "not_found"},
		{name: "exec without command", method: http.MethodPost, path: "/exec", body: map[string]any{}, status: 400, code: "bad_request"},
		{name: "exec command and argv", method: http.MethodPost, path: "/exec", body: map[string]any{"command": "true", "argv": []string{"true"}}, status: 400, code: "bad_request"},
		{name: "missing file", method: http.MethodGet, path: "/files/stat?path=/nonexistent/x", status: 404, code: "not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := callJSON(t, tt.method, base+tt.path, testKey, tt.body)
			assert.Equal(t, tt.status, resp.StatusCode, "body %s", body)
			assert.Equal(t, tt.code, decodeError(t, body).Code)
		})
	}
}

func TestProxy_ForbiddenPathIsTheSandboxsAnswer_RealAgent(t *testing.T) {
	gw, _, _ := withAgent(t, nil)
	// /proc/1/mem cannot be read here even by root: the agent answers 403
	// forbidden, its own refusal, not a refused gateway token.
	resp, body := call(t, http.MethodGet, gw.URL+"/v1/sandboxes/sbx-1/files?path=/proc/1/mem", testKey, nil)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "body %s", body)
	e := decodeError(t, body)
	assert.Equal(t, "forbidden", e.Code)
	assert.Contains(t, e.Message, "/proc/1/mem")
	assert.Contains(t, e.Message, "permission denied")
}

func TestProxy_StreamedForbiddenPassesThrough(t *testing.T) {
	const refusal = `{"error":{"code":"forbidden","message":"path /etc/x: permission denied"}}`
	gw, _ := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(refusal))
	})
	tests := []struct {
		name   string
		method string
		path   string
		body   io.Reader
	}{
		{name: "download", method: http.MethodGet, path: "/files?path=/etc/x"},
		{name: "archive download", method: http.MethodGet, path: "/files/archive?path=/etc/x"},
		{name: "upload", method: http.MethodPut, path: "/files?path=/etc/x", body: strings.NewReader("data")},
		{name: "archive upload", method: http.MethodPut, path: "/files/archive?path=/etc", body: strings.NewReader("tar")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := call(t, tt.method, gw.URL+"/v1/sandboxes/sbx-1"+tt.path, testKey, tt.body)
			assert.Equal(t, http.StatusForbidden, resp.StatusCode, "body %s", body)
			assert.Equal(t, refusal, string(body))
		})
	}
}

func TestProxy_StaleGenerationIsGone_RealAgent(t *testing.T) {
	gw, agent, _ := withAgent(t, nil)
	// A newer lease took the sandbox: the agent was initialised with a
	// higher generation than sbx-1's.
	_, err := agentapi.New(agent.URL, agentToken, nil).Init(context.Background(), agentapi.InitRequest{LeaseID: "sbx-2", Generation: 5})
	require.NoError(t, err)
	resp, body := callJSON(t, http.MethodPost, gw.URL+"/v1/sandboxes/sbx-1/exec", testKey, agentapi.ExecRequest{Command: "true"})
	assert.Equal(t, http.StatusGone, resp.StatusCode, "body %s", body)
	e := decodeError(t, body)
	assert.Equal(t, "gone", e.Code)
	assert.Contains(t, e.Message, "sandbox sbx-1")
	assert.Contains(t, e.Message, "newer lease")
}

func TestProxy_ExecSSEArrivesIncrementally_RealAgent(t *testing.T) {
	gw, agent, _ := withAgent(t, nil)
	// The command prints, then waits for a file that the test creates only
	// after it has received the first event: the stream must deliver it
	// while the command still runs.
	b, err := json.Marshal(agentapi.ExecRequest{Command: "echo first; while [ ! -e go ]; do sleep 0.02; done; echo second", TimeoutMS: 20000})
	require.NoError(t, err)
	resp := openStream(t, http.MethodPost, gw.URL+"/v1/sandboxes/sbx-1/exec", bytes.NewReader(b), "Accept", "text/event-stream")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))

	events := readEvents(resp.Body)
	ev := <-events
	require.Equal(t, agentapi.EventStdout, ev.name)
	assert.JSONEq(t, `{"data": "first\n"}`, ev.data)
	require.NoError(t, os.WriteFile(filepath.Join(agent.Workdir, "go"), nil, 0o600))

	var names []string
	var exit agentapi.ExecResult
	for ev := range events {
		names = append(names, ev.name)
		if ev.name == agentapi.EventExit {
			require.NoError(t, json.Unmarshal([]byte(ev.data), &exit))
		}
	}
	assert.Equal(t, []string{agentapi.EventStdout, agentapi.EventExit}, names)
	assert.Equal(t, 0, exit.ExitCode)
}

type sseEvent struct{ name, data string }

// readEvents parses server-sent events from r until it ends.
func readEvents(r io.Reader) <-chan sseEvent {
	ch := make(chan sseEvent, 64)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.data = strings.TrimPrefix(line, "data: ")
			case line == "" && ev.name != "":
				ch <- ev
				ev = sseEvent{}
			}
		}
	}()
	return ch
}

func TestProxy_FilesByteExact_RealAgent(t *testing.T) {
	gw, _, _ := withAgent(t, nil)
	base := gw.URL + "/v1/sandboxes/sbx-1"
	tests := []struct {
		name    string
		size    int
		chunked bool
	}{
		{name: "empty", size: 0},
		{name: "small", size: 1000},
		{name: "large with length", size: 24 << 20},
		{name: "large chunked", size: 9<<20 + 123, chunked: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := make([]byte, tt.size)
			_, err := rand.Read(data)
			require.NoError(t, err)
			var body io.Reader = bytes.NewReader(data)
			if tt.chunked {
				body = struct{ io.Reader }{body} // unknown length: chunked
			}
			name := strings.ReplaceAll(tt.name, " ", "_")
			resp, b := call(t, http.MethodPut, base+"/files?path=up/"+name+"&mode=0600", testKey, body)
			require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", b)
			assert.Equal(t, int64(tt.size), decode[agentapi.WriteResult](t, b).Bytes)

			resp, got := call(t, http.MethodGet, base+"/files?path=up/"+name, testKey, nil)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			assert.True(t, bytes.Equal(data, got), "downloaded %d bytes, uploaded %d", len(got), len(data))

			if tt.size > 100 {
				resp, got = call(t, http.MethodGet, base+"/files?path=up/"+name+"&offset=10&length=50", testKey, nil)
				require.Equal(t, http.StatusOK, resp.StatusCode)
				assert.Equal(t, data[10:60], got, "the query string passes through")
			}
		})
	}
}

func TestProxy_FileCreateExclusiveAndDelete_RealAgent(t *testing.T) {
	gw, _, _ := withAgent(t, nil)
	base := gw.URL + "/v1/sandboxes/sbx-1/files?path=claims/x"
	resp, b := call(t, http.MethodPut, base+"&exclusive=true", testKey, strings.NewReader("first"))
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", b)
	resp, b = call(t, http.MethodPut, base+"&exclusive=true", testKey, strings.NewReader("second"))
	assert.Equal(t, http.StatusConflict, resp.StatusCode, "body %s", b)
	assert.Contains(t, string(b), "already exists")
	resp, got := call(t, http.MethodGet, base, testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "first", string(got), "the refused write changed nothing")

	resp, b = call(t, http.MethodDelete, base, testKey, nil)
	assert.Equal(t, http.StatusNoContent, resp.StatusCode, "body %s", b)
	resp, b = call(t, http.MethodDelete, base, testKey, nil)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "body %s", b)
	resp, _ = call(t, http.MethodDelete, base, "", nil)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

// A client that gives up on a command answered whole (its HTTP timeout,
// a retry) ends the command in the sandbox: the session is free for the
// retry instead of busy until the command's own timeout.
func TestProxy_ClientLeavingCancelsTheCommand_RealAgent(t *testing.T) {
	gw, _, _ := withAgent(t, nil)
	base := gw.URL + "/v1/sandboxes/sbx-1"
	resp, body := callJSON(t, http.MethodPost, base+"/sessions", testKey, agentapi.SessionCreateRequest{})
	require.Equal(t, http.StatusCreated, resp.StatusCode, "body %s", body)
	run := base + "/sessions/" + decode[agentapi.SessionInfo](t, body).ID + "/run"

	impatient := &http.Client{Timeout: 500 * time.Millisecond}
	req, err := http.NewRequest(http.MethodPost, run, strings.NewReader(`{"command": "sleep 120", "timeout_ms": 300000}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	_, err = impatient.Do(req)
	require.Error(t, err, "the client gave up")

	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, body = callJSON(t, http.MethodPost, run, testKey, agentapi.SessionRunRequest{Command: "echo free"})
		if resp.StatusCode == http.StatusOK {
			break
		}
		require.Equal(t, http.StatusConflict, resp.StatusCode, "body %s", body)
		require.True(t, time.Now().Before(deadline), "the session is still busy with the abandoned command")
		time.Sleep(50 * time.Millisecond)
	}
	assert.Equal(t, "free\n", decode[agentapi.SessionRunResult](t, body).Output)
}

func TestProxy_ArchiveRoundTrip_RealAgent(t *testing.T) {
	gw, _, _ := withAgent(t, nil)
	base := gw.URL + "/v1/sandboxes/sbx-1"
	files := map[string]string{"a.txt": "alpha", "sub/b.txt": strings.Repeat("beta", 50000)}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range []string{"a.txt", "sub/b.txt"} {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(files[name])), Typeflag: tar.TypeReg}))
		_, err := tw.Write([]byte(files[name]))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())

	resp, body := call(t, http.MethodPut, base+"/files/archive?path=tree", testKey, bytes.NewReader(buf.Bytes()), "Content-Type", "application/x-tar")
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)

	resp, body = call(t, http.MethodGet, base+"/files/list?path=tree", testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	assert.Len(t, decode[agentapi.FileList](t, body).Entries, 2)

	resp, body = call(t, http.MethodGet, base+"/files/archive?path=tree", testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	got := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(body))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			require.NoError(t, err)
			got[strings.TrimPrefix(h.Name, "./")] = string(b)
		}
	}
	assert.Equal(t, files, got)
}

func TestProxy_BodyLimits(t *testing.T) {
	gw, _, _ := withAgent(t, func(c *Config) { c.MaxJSONBody = 64 << 10; c.MaxUploadBody = 1 << 20 })
	base := gw.URL + "/v1/sandboxes/sbx-1"
	big := make([]byte, 2<<20)
	tests := []struct {
		name   string
		method string
		path   string
		body   io.Reader
	}{
		{name: "upload with length", method: http.MethodPut, path: "/files?path=big", body: bytes.NewReader(big)},
		{name: "upload chunked", method: http.MethodPut, path: "/files?path=big2", body: struct{ io.Reader }{bytes.NewReader(big)}},
		{name: "stdin", method: http.MethodPost, path: "/processes/p-1/stdin", body: bytes.NewReader(big)},
		{name: "json", method: http.MethodPost, path: "/exec", body: strings.NewReader(`{"command": "` + strings.Repeat("x", 100<<10) + `"}`)},
		{name: "json chunked", method: http.MethodPost, path: "/sessions", body: struct{ io.Reader }{strings.NewReader(`{"cwd": "` + strings.Repeat("x", 100<<10) + `"}`)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := call(t, tt.method, base+tt.path, testKey, tt.body)
			assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "body %s", body)
			assert.Equal(t, "payload_too_large", decodeError(t, body).Code)
		})
	}
}

func TestProxy_AgentDown_ChecksTask(t *testing.T) {
	deadURL := refusedURL(t)

	tests := []struct {
		name    string
		check   func(context.Context, warmpool.Lease) (warmpool.Lease, error)
		status  int
		code    string
		message string
	}{
		{name: "task alive", check: func(_ context.Context, l warmpool.Lease) (warmpool.Lease, error) { return l, nil },
			status: 502, code: "agent_unreachable", message: "unreachable"},
		{name: "check fails", check: func(context.Context, warmpool.Lease) (warmpool.Lease, error) {
			return warmpool.Lease{}, warmpool.ErrUnavailable
		},
			status: 502, code: "agent_unreachable", message: "unreachable"},
		{name: "task dead", check: func(_ context.Context, l warmpool.Lease) (warmpool.Lease, error) {
			l.State, l.Reason = warmpool.LeaseLost, "task stopped: exit 137"
			return l, nil
		}, status: 410, code: "gone", message: "was lost (task stopped: exit 137)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mgr := newFakeManager(deadURL)
			mgr.addLease("sbx-1", testKey, deadURL, 1)
			mgr.CheckTaskFn = tt.check
			gw := startGateway(t, mgr, nil)
			resp, body := callJSON(t, http.MethodPost, gw.URL+"/v1/sandboxes/sbx-1/sessions/ses-1/run", testKey, agentapi.SessionRunRequest{Command: "true"})
			assert.Equal(t, tt.status, resp.StatusCode, "body %s", body)
			e := decodeError(t, body)
			assert.Equal(t, tt.code, e.Code)
			assert.Contains(t, e.Message, tt.message)
			assert.Contains(t, e.Message, "sandbox sbx-1")
			assert.Equal(t, []string{"CheckTask:sbx-1"}, mgr.Calls("CheckTask"))
		})
	}
}

// fakeAgent is an httptest agent whose handler the test scripts.
func fakeAgent(t *testing.T, h http.HandlerFunc) (*testGateway, *fakeManager) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	mgr := newFakeManager(srv.URL)
	mgr.addLease("sbx-1", testKey, srv.URL, 7)
	return startGateway(t, mgr, func(c *Config) { c.TimeoutMargin = 200 * time.Millisecond }), mgr
}

func TestProxy_SendsAgentCredentialsPathAndQuery(t *testing.T) {
	type seen struct{ method, uri, auth, gen, ctype, accept, body string }
	got := make(chan seen, 1)
	gw, _ := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.RequestURI, r.Header.Get("Authorization"), r.Header.Get(agentapi.HeaderGeneration),
			r.Header.Get("Content-Type"), r.Header.Get("Accept"), string(b)}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Agent", "yes")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"ok": true}`))
	})
	resp, body := call(t, http.MethodPost, gw.URL+"/v1/sandboxes/sbx-1/processes/p-9/signal?x=1&path=%2Fa%20b", testKey,
		strings.NewReader(`{"signal":"TERM"}`), "Content-Type", "application/json", "Accept", "application/json")
	require.Equal(t, http.StatusCreated, resp.StatusCode, "body %s", body)
	assert.JSONEq(t, `{"ok": true}`, string(body))
	assert.Equal(t, "yes", resp.Header.Get("X-Agent"), "agent headers pass through")
	assert.Len(t, resp.Header.Values("Date"), 1)
	s := <-got
	assert.Equal(t, seen{
		method: http.MethodPost, uri: "/v1/processes/p-9/signal?x=1&path=%2Fa%20b", auth: "Bearer " + agentToken, gen: "7",
		ctype: "application/json", accept: "application/json", body: `{"signal":"TERM"}`,
	}, s)
}

func TestProxy_AgentAnswersMapped(t *testing.T) {
	tests := []struct {
		name     string
		status   int
		body     string
		want     int
		wantBody string // exact pass-through when set
		code     string
		message  string // the gateway's own message, when wantBody is not set
	}{
		{name: "busy passes through", status: 409, body: `{"error":{"code":"busy","message":"session ses-1 is running a command"}}`, want: 409,
			wantBody: `{"error":{"code":"busy","message":"session ses-1 is running a command"}}`},
		{name: "bad request passes through", status: 400, body: `{"error":{"code":"bad_request","message":"timeout_ms: above 86400000"}}`, want: 400,
			wantBody: `{"error":{"code":"bad_request","message":"timeout_ms: above 86400000"}}`},
		{name: "too large passes through", status: 413, body: `{"error":{"code":"payload_too_large","message":"file over 1 GiB"}}`, want: 413,
			wantBody: `{"error":{"code":"payload_too_large","message":"file over 1 GiB"}}`},
		{name: "stale generation is gone", status: 409, body: `{"error":{"code":"stale_generation","message":"generation 7 < 8"}}`, want: 410, code: "gone"},
		{name: "refused token is a gateway problem", status: 401, body: `{"error":{"code":"unauthorized","message":"bad token"}}`, want: 502, code: "agent_unreachable"},
		{name: "a full disk passes through", status: 507, body: `{"error":{"code":"insufficient_storage","message":"write \"/home/sandbox/f\": no space left on device"}}`, want: 507,
			wantBody: `{"error":{"code":"insufficient_storage","message":"write \"/home/sandbox/f\": no space left on device"}}`},
		{name: "at the pids limit names kill-all and says when to retry", status: 503,
			body: `{"error":{"code":"pids_limit","message":"the sandbox is at its pids limit (200 processes and threads): nothing can start until some exit; retry, or kill every process of the sandbox"}}`,
			want: 503, code: "pids_limit",
			message: "the sandbox is at its pids limit (200 processes and threads): nothing can start until some exit; retry, or kill every process of the sandbox (POST /v1/sandboxes/sbx-1/kill-all)"},
		{name: "another 503 passes through", status: 503, body: `{"error":{"code":"unavailable","message":"agent is shutting down"}}`, want: 503,
			wantBody: `{"error":{"code":"unavailable","message":"agent is shutting down"}}`},
		{name: "forbidden passes through", status: 403, body: `{"error":{"code":"forbidden","message":"path /root/x: permission denied"}}`, want: 403,
			wantBody: `{"error":{"code":"forbidden","message":"path /root/x: permission denied"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, sse := range []bool{false, true} {
				gw, _ := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(tt.status)
					_, _ = w.Write([]byte(tt.body))
				})
				hdr := []string{"Content-Type", "application/json"}
				if sse {
					hdr = append(hdr, "Accept", "text/event-stream")
				}
				resp, body := call(t, http.MethodPost, gw.URL+"/v1/sandboxes/sbx-1/exec", testKey, strings.NewReader(`{"command":"x"}`), hdr...)
				assert.Equal(t, tt.want, resp.StatusCode, "sse=%v body %s", sse, body)
				if tt.wantBody != "" {
					assert.Equal(t, tt.wantBody, string(body), "sse=%v", sse)
					assert.Empty(t, resp.Header.Get("Retry-After"), "sse=%v", sse)
				} else {
					e := decodeError(t, body)
					assert.Equal(t, tt.code, e.Code, "sse=%v", sse)
					if tt.message != "" {
						assert.Equal(t, tt.message, e.Message, "sse=%v", sse)
						assert.Equal(t, "2", resp.Header.Get("Retry-After"), "sse=%v: retryable", sse)
					}
				}
			}
		})
	}
}

func TestProxy_AgentTimeoutIs504(t *testing.T) {
	release := make(chan struct{})
	gw, mgr := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select { // never answers while the test runs
		case <-r.Context().Done():
		case <-release:
		}
	})
	t.Cleanup(func() { close(release) }) // runs before the agent's Close
	resp, body := callJSON(t, http.MethodPost, gw.URL+"/v1/sandboxes/sbx-1/sessions/ses-1/run", testKey, agentapi.SessionRunRequest{Command: "true", TimeoutMS: 50})
	assert.Equal(t, http.StatusGatewayTimeout, resp.StatusCode, "body %s", body)
	e := decodeError(t, body)
	assert.Equal(t, "timeout", e.Code)
	assert.Contains(t, e.Message, "did not answer in time")
	assert.Len(t, mgr.Calls("CheckTask"), 1)
}

func TestProxy_ClientDisconnectCancelsUpstream(t *testing.T) {
	var canceled atomic.Bool
	gw, _ := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "event: stdout\ndata: {\"data\":\"hello\"}\n\n")
		w.(http.Flusher).Flush()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-r.Context().Done():
				canceled.Store(true)
				return
			case <-tick.C:
				if _, err := io.WriteString(w, ": keep-alive\n\n"); err != nil {
					canceled.Store(true)
					return
				}
				w.(http.Flusher).Flush()
			}
		}
	})
	conn, err := net.Dial("tcp", strings.TrimPrefix(gw.URL, "http://"))
	require.NoError(t, err)
	body := `{"command":"sleep 1000"}`
	_, err = fmt.Fprintf(conn, "POST /v1/sandboxes/sbx-1/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nAccept: text/event-stream\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		testKey, len(body), body)
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ev := <-readEvents(resp.Body)
	assert.Equal(t, agentapi.EventStdout, ev.name)
	require.NoError(t, conn.Close())
	eventually(t, canceled.Load, "the agent sees its request end after the client left")
}

func TestProxy_MetricsByRouteTemplate(t *testing.T) {
	gw, _, _ := withAgent(t, nil)
	resp, _ := callJSON(t, http.MethodPost, gw.URL+"/v1/sandboxes/sbx-1/exec", testKey, agentapi.ExecRequest{Command: "true"})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, _ = call(t, http.MethodGet, gw.URL+"/v1/sandboxes/sbx-404", testKey, nil)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	resp, _ = call(t, http.MethodGet, gw.URL+"/no/such/route", testKey, nil)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)

	resp, body := call(t, http.MethodGet, gw.URL+"/metrics", testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	text := string(body)
	assert.Contains(t, text, `quarry_gateway_requests_total{method="POST",route="/v1/sandboxes/:id/exec",status="200"} 1`)
	assert.Contains(t, text, `quarry_gateway_requests_total{method="GET",route="/v1/sandboxes/:id",status="404"} 1`)
	assert.Contains(t, text, `quarry_gateway_requests_total{method="GET",route="unmatched",status="404"} 1`)
	assert.Contains(t, text, `quarry_gateway_request_duration_seconds_bucket{method="POST",route="/v1/sandboxes/:id/exec",status="200"`)
	assert.Contains(t, text, "quarry_gateway_agent_clients 1")
}

func TestCommandTimeout(t *testing.T) {
	g := &Gateway{cfg: Config{APIKeys: []string{testKey}, TimeoutMargin: time.Second, MaxCommandTimeout: time.Hour}.WithDefaults()}
	tests := []struct {
		name string
		body string
		want time.Duration
	}{
		{name: "timeout_ms plus margin", body: `{"command":"x","timeout_ms":2500}`, want: 3500 * time.Millisecond},
		{name: "none: agent default", body: `{"command":"x"}`, want: DefaultCommandTimeout + time.Second},
		{name: "capped", body: `{"timeout_ms": 99999999999}`, want: time.Hour},
		{name: "malformed: default", body: `{"timeout_ms": "soon"}`, want: DefaultCommandTimeout + time.Second},
		{name: "empty body", body: ``, want: DefaultCommandTimeout + time.Second},
		{name: "the key in capitals, as Go's decoder (the agent's) takes it", body: `{"TIMEOUT_MS":2500}`, want: 3500 * time.Millisecond},
		{name: "the key in escapes", body: `{"timeout\u005fms":2500}`, want: 3500 * time.Millisecond},
		{name: "the key at the end of the body", body: `{"command":"x","timeout_ms":1}`, want: time.Second + time.Millisecond},
		{name: "no such key, a word like it", body: `{"command":"echo timeout_m"}`, want: DefaultCommandTimeout + time.Second},
		{name: "the key with a letter Go's decoder folds (U+017F for s)", body: `{"timeout_mſ":2500}`, want: 3500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, g.commandTimeout([]byte(tt.body)))
		})
	}
}

func TestIsUpload(t *testing.T) {
	tests := []struct {
		name   string
		method string
		uri    string
		want   bool
	}{
		{name: "file write", method: "PUT", uri: "/v1/sandboxes/sbx-1/files?path=/x", want: true},
		{name: "archive upload", method: "PUT", uri: "/v1/sandboxes/sbx-1/files/archive?path=/x", want: true},
		{name: "stdin", method: "POST", uri: "/v1/sandboxes/sbx-1/processes/p-1/stdin?close=true", want: true},
		{name: "file read", method: "GET", uri: "/v1/sandboxes/sbx-1/files?path=/x", want: false},
		{name: "exec", method: "POST", uri: "/v1/sandboxes/sbx-1/exec", want: false},
		{name: "create", method: "POST", uri: "/v1/sandboxes", want: false},
		{name: "stat is not an upload", method: "PUT", uri: "/v1/sandboxes/sbx-1/files/stat", want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, isUpload([]byte(tt.method), []byte(tt.uri)))
		})
	}
}

func TestNewProxyRoute_AgentPath(t *testing.T) {
	tests := []struct {
		name string
		path string
		want []string
	}{
		{name: "exec", path: "/v1/sandboxes/:id/exec", want: []string{"/v1/exec"}},
		{name: "session run", path: "/v1/sandboxes/:id/sessions/:sid/run", want: []string{"/v1/sessions/", ":sid", "/run"}},
		{name: "process", path: "/v1/sandboxes/:id/processes/:pid", want: []string{"/v1/processes/", ":pid"}},
		{name: "archive", path: "/v1/sandboxes/:id/files/archive", want: []string{"/v1/files/archive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, newProxyRoute(tt.path, kindJSON).parts)
		})
	}
}

// cutProxy relays TCP connections to an agent until cut closes them all, as
// if the agent died mid-call.
type cutProxy struct {
	URL string

	target string
	ln     net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
}

// startCutProxy relays 127.0.0.1 connections to targetURL's host; it stops
// when the test ends.
func startCutProxy(t *testing.T, targetURL string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &cutProxy{URL: "http://" + ln.Addr().String(), target: strings.TrimPrefix(targetURL, "http://"), ln: ln}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

func (p *cutProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
}

// cut closes every relayed connection.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

func TestProxy_StreamCutByAgentEndsWithErrorEvent_RealAgent(t *testing.T) {
	alive := func(_ context.Context, l warmpool.Lease) (warmpool.Lease, error) { return l, nil }
	lost := func(_ context.Context, l warmpool.Lease) (warmpool.Lease, error) {
		l.State, l.Reason = warmpool.LeaseLost, "task stopped: exit 137"
		return l, nil
	}
	tests := []struct {
		name    string
		follow  bool
		check   func(context.Context, warmpool.Lease) (warmpool.Lease, error)
		code    string
		message string
	}{
		{name: "exec, task alive", check: alive, code: "agent_unreachable", message: "the agent of sandbox sbx-1"},
		{name: "exec, lease lost", check: lost, code: "gone", message: "sandbox sbx-1 was lost (task stopped: exit 137)"},
		{name: "process follow, task alive", follow: true, check: alive, code: "agent_unreachable", message: "the agent of sandbox sbx-1"},
		{name: "process follow, lease lost", follow: true, check: lost, code: "gone", message: "sandbox sbx-1 was lost (task stopped: exit 137)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			agent := startAgent(t)
			proxy := startCutProxy(t, agent.URL)
			mgr := newFakeManager(proxy.URL)
			mgr.addLease("sbx-1", testKey, proxy.URL, 1)
			mgr.CheckTaskFn = tt.check
			gw := startGateway(t, mgr, nil)
			base := gw.URL + "/v1/sandboxes/sbx-1"

			var resp *http.Response
			if tt.follow {
				r, body := callJSON(t, http.MethodPost, base+"/processes", testKey, agentapi.ProcessStartRequest{Command: "echo first; sleep 60"})
				require.Less(t, r.StatusCode, 300, "body %s", body)
				proc := decode[agentapi.ProcessInfo](t, body)
				resp = openStream(t, http.MethodGet, base+"/processes/"+proc.ID+"/output?follow=true", nil)
			} else {
				b, err := json.Marshal(agentapi.ExecRequest{Command: "echo first; sleep 60", TimeoutMS: 90000})
				require.NoError(t, err)
				resp = openStream(t, http.MethodPost, base+"/exec", bytes.NewReader(b), "Accept", "text/event-stream")
			}
			require.Equal(t, http.StatusOK, resp.StatusCode)
			events := readEvents(resp.Body)
			first := <-events
			require.Contains(t, first.data, "first")
			proxy.cut()

			var last sseEvent
			n := 0
			for ev := range events {
				last = ev
				n++
			}
			require.Equal(t, 1, n, "one event after the cut: the error")
			assert.Equal(t, agentapi.EventError, last.name)
			var detail agentapi.ErrorDetail
			require.NoError(t, json.Unmarshal([]byte(last.data), &detail), "data %s", last.data)
			assert.Equal(t, tt.code, detail.Code)
			assert.Contains(t, detail.Message, tt.message)
			assert.Equal(t, []string{"CheckTask:sbx-1"}, mgr.Calls("CheckTask"))
		})
	}
}

func TestEventWatch_FinalEvent(t *testing.T) {
	tests := []struct {
		name       string
		chunks     []string
		final      bool
		terminator string
	}{
		{name: "exit event", chunks: []string{"event: stdout\ndata: {}\n\n", "event: exit\ndata: {}\n\n"}, final: true},
		{name: "error event split across reads", chunks: []string{"event: err", "or\r\ndata: {\"code\":\"gone\"}\r\n", "\r\n"}, final: true},
		{name: "exit without its blank line", chunks: []string{"event: exit\ndata: {}\n"}, terminator: "\n"},
		{name: "cut mid-line", chunks: []string{"event: stdout\ndata: {\"da"}, terminator: "\n\n"},
		{name: "only keep-alives", chunks: []string{": keep-alive\n\n"}},
		{name: "output then nothing", chunks: []string{"event: output\ndata: {}\n\n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var w eventWatch
			for _, c := range tt.chunks {
				w.feed([]byte(c))
			}
			assert.Equal(t, tt.final, w.final)
			assert.Equal(t, tt.terminator, string(w.terminator()))
		})
	}
}

func TestProxy_AgentShutdownGoneIs410(t *testing.T) {
	const agentGone = `{"error":{"code":"gone","message":"the command was killed: the agent is shutting down"}}`
	tests := []struct {
		name     string
		check    func(context.Context, warmpool.Lease) (warmpool.Lease, error)
		wantBody string // exact pass-through when set
		message  string
	}{
		{name: "lease still active: the agent's answer passes through",
			check: func(_ context.Context, l warmpool.Lease) (warmpool.Lease, error) { return l, nil }, wantBody: agentGone},
		{name: "check fails: the agent's answer passes through",
			check: func(context.Context, warmpool.Lease) (warmpool.Lease, error) {
				return warmpool.Lease{}, warmpool.ErrUnavailable
			}, wantBody: agentGone},
		{name: "lease released: says so",
			check: func(_ context.Context, l warmpool.Lease) (warmpool.Lease, error) {
				l.State, l.Reason = warmpool.LeaseReleased, "released by its owner"
				return l, nil
			}, message: "sandbox sbx-1 was released (released by its owner)"},
		{name: "lease expired: says so",
			check: func(_ context.Context, l warmpool.Lease) (warmpool.Lease, error) {
				l.State = warmpool.LeaseExpired
				return l, nil
			}, message: "sandbox sbx-1 expired"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gw, mgr := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusGone)
				_, _ = w.Write([]byte(agentGone))
			})
			mgr.CheckTaskFn = tt.check
			resp, body := callJSON(t, http.MethodPost, gw.URL+"/v1/sandboxes/sbx-1/exec", testKey, agentapi.ExecRequest{Command: "sleep 100"})
			assert.Equal(t, http.StatusGone, resp.StatusCode, "body %s", body)
			if tt.wantBody != "" {
				assert.Equal(t, tt.wantBody, string(body))
			} else {
				e := decodeError(t, body)
				assert.Equal(t, "gone", e.Code)
				assert.Contains(t, e.Message, tt.message)
			}
			assert.Len(t, mgr.Calls("CheckTask"), 1)
		})
	}
}

func TestProxy_AgentShutdownErrorEventPassesThrough(t *testing.T) {
	const final = "event: error\ndata: {\"code\":\"gone\",\"message\":\"the command was killed: the agent is shutting down\"}\n\n"
	gw, mgr := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "event: stdout\ndata: {\"data\":\"hi\\n\"}\n\n: keep-alive\n\n"+final)
	})
	resp, body := call(t, http.MethodPost, gw.URL+"/v1/sandboxes/sbx-1/exec", testKey, strings.NewReader(`{"command":"x"}`),
		"Content-Type", "application/json", "Accept", "text/event-stream")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.True(t, strings.HasSuffix(string(body), final), "the agent's error event ends the stream, nothing added: %s", body)
	assert.Equal(t, 1, strings.Count(string(body), "event: error"))
	assert.Empty(t, mgr.Calls("CheckTask"), "a stream that ended whole needs no check")
}

func TestProxy_AgentShutdownKillsCommand_RealAgent(t *testing.T) {
	released := func(_ context.Context, l warmpool.Lease) (warmpool.Lease, error) {
		l.State, l.Reason = warmpool.LeaseReleased, "released by its owner"
		return l, nil
	}
	closeAgent := func(t *testing.T, agent *testAgent) {
		ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
		defer cancel()
		require.NoError(t, agent.Srv.Close(ctx)) // the sandbox stops
	}
	body, err := json.Marshal(agentapi.ExecRequest{Command: "echo started; touch started; sleep 60", TimeoutMS: 90000})
	require.NoError(t, err)

	t.Run("buffered exec answers 410 saying how the lease ended", func(t *testing.T) {
		gw, agent, mgr := withAgent(t, nil)
		mgr.CheckTaskFn = released
		done := callAsync(context.Background(), http.MethodPost, gw.URL+"/v1/sandboxes/sbx-1/exec", testKey, bytes.NewReader(body),
			"Content-Type", "application/json")
		eventually(t, func() bool {
			_, err := os.Stat(filepath.Join(agent.Workdir, "started"))
			return err == nil
		}, "the command runs")
		closeAgent(t, agent)
		r := <-done
		require.NoError(t, r.err)
		assert.Equal(t, http.StatusGone, r.status, "body %s", r.body)
		e := decodeError(t, r.body)
		assert.Equal(t, "gone", e.Code)
		assert.Contains(t, e.Message, "sandbox sbx-1 was released (released by its owner)")
	})
	t.Run("streaming exec ends with the agent's error event", func(t *testing.T) {
		gw, agent, _ := withAgent(t, nil)
		resp := openStream(t, http.MethodPost, gw.URL+"/v1/sandboxes/sbx-1/exec", bytes.NewReader(body),
			"Content-Type", "application/json", "Accept", "text/event-stream")
		require.Equal(t, http.StatusOK, resp.StatusCode)
		events := readEvents(resp.Body)
		require.Equal(t, agentapi.EventStdout, (<-events).name)
		closeAgent(t, agent)
		var names []string
		var last sseEvent
		for ev := range events {
			names, last = append(names, ev.name), ev
		}
		assert.Equal(t, []string{agentapi.EventError}, names, "one error event, the agent's")
		var detail agentapi.ErrorDetail
		require.NoError(t, json.Unmarshal([]byte(last.data), &detail), "data %s", last.data)
		assert.Equal(t, "gone", detail.Code)
	})
}

// POST /v1/sandboxes/{id}/kill-all reaches the agent's kill-all: the
// sandbox's processes and session shells die, the lease goes on.
func TestProxy_KillAll_RealAgent(t *testing.T) {
	gw, _, _ := withAgent(t, nil)
	base := gw.URL + "/v1/sandboxes/sbx-1"
	resp, body := callJSON(t, http.MethodPost, base+"/processes", testKey, agentapi.ProcessStartRequest{Command: "sleep 1000"})
	require.Less(t, resp.StatusCode, 300, "body %s", body)
	proc := decode[agentapi.ProcessInfo](t, body)
	resp, body = callJSON(t, http.MethodPost, base+"/sessions", testKey, agentapi.SessionCreateRequest{})
	require.Equal(t, http.StatusCreated, resp.StatusCode, "body %s", body)

	resp, body = call(t, http.MethodPost, base+"/kill-all", testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	res := decode[agentapi.KillAllResult](t, body)
	assert.Equal(t, 2, res.Killed, "the process and the session's shell: %s", body)
	assert.Zero(t, res.Left)

	_, body = call(t, http.MethodGet, base+"/processes/"+proc.ID, testKey, nil)
	info := decode[agentapi.ProcessInfo](t, body)
	assert.Equal(t, agentapi.ProcessExited, info.State)
	assert.Equal(t, "SIGKILL", info.Signal)
	_, body = call(t, http.MethodGet, base+"/sessions", testKey, nil)
	assert.Empty(t, decode[agentapi.SessionList](t, body).Sessions, "sessions end")
	resp, body = callJSON(t, http.MethodPost, base+"/exec", testKey, agentapi.ExecRequest{Command: "echo ok"})
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	assert.Equal(t, "ok\n", decode[agentapi.ExecResult](t, body).Stdout)

	resp, body = call(t, http.MethodPost, base+"/kill-all", testKey, strings.NewReader(`{"all": true}`), "Content-Type", "application/json")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "the agent's 400 passes through: %s", body)
}

// A body mayNameTimeout passes over is one Go's decoder (the agent's)
// reads no timeout_ms from: skipping its decode changes no call's bound.
func FuzzMayNameTimeout(f *testing.F) {
	for _, seed := range []string{`{"command":"x","timeout_ms":2500}`, `{"TIMEOUT_MS":1}`, `{"timeout\u005fms":2}`,
		"{\"timeout_m\u017f\":3}", `{"command":"echo timeout_m"}`, `{"Timeout_Ms":4,"x":[1,2]}`, ``} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if mayNameTimeout(body) {
			return
		}
		var v struct {
			TimeoutMS int64 `json:"timeout_ms"`
		}
		if json.Unmarshal(body, &v) == nil && v.TimeoutMS != 0 {
			t.Fatalf("mayNameTimeout(%q) = false, but the decoder reads timeout_ms %d from it", body, v.TimeoutMS)
		}
	})
}

// Call ids are what the agent accepts (1 to 64 of [A-Za-z0-9_-]) and
// never repeat.
func TestNewCallID_ValidAndUnique(t *testing.T) {
	valid := regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	seen := map[string]bool{}
	for range 10000 {
		id := newCallID()
		require.Regexp(t, valid, id)
		require.False(t, seen[id], "id %s twice", id)
		seen[id] = true
	}
}
