package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

const testKey = "test-key"

// waitTimeout bounds every wait of these tests; generous for a busy CI machine.
const waitTimeout = 30 * time.Second

// newTestClient serves h on 127.0.0.1 and returns a client for it.
func newTestClient(t *testing.T, h http.HandlerFunc, opts ...Option) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return New(srv.URL+"/", testKey, opts...)
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return ctx
}

// seen is what the test server saw of one request.
type seen struct {
	method, path, query, auth, accept, contentType, body string
}

func TestClient_Routes_SendDocumentedRequests(t *testing.T) {
	tests := []struct {
		name   string
		call   func(ctx context.Context, c *Client) error
		want   seen // auth is checked separately
		noAuth bool
	}{
		{"create sandbox", func(ctx context.Context, c *Client) error {
			_, err := c.CreateSandbox(ctx, CreateSandboxRequest{Pool: "default", LeaseSeconds: 60, Env: map[string]string{"A": "1"}, Labels: map[string]string{"run": "x"}})
			return err
		}, seen{method: "POST", path: "/v1/sandboxes", body: `{"pool":"default","lease_seconds":60,"env":{"A":"1"},"labels":{"run":"x"}}`}, false},
		{"list sandboxes", func(ctx context.Context, c *Client) error {
			_, err := c.ListSandboxes(ctx, ListSandboxesRequest{Pool: "p", State: "active", Labels: map[string]string{"b": "2", "a": "1"}})
			return err
		}, seen{method: "GET", path: "/v1/sandboxes", query: "label=a%3D1&label=b%3D2&pool=p&state=active"}, false},
		{"get sandbox", func(ctx context.Context, c *Client) error { _, err := c.GetSandbox(ctx, "sbx-1"); return err },
			seen{method: "GET", path: "/v1/sandboxes/sbx-1"}, false},
		{"heartbeat", func(ctx context.Context, c *Client) error { _, err := c.Heartbeat(ctx, "sbx-1"); return err },
			seen{method: "POST", path: "/v1/sandboxes/sbx-1/heartbeat"}, false},
		{"delete sandbox", func(ctx context.Context, c *Client) error { _, err := c.DeleteSandbox(ctx, "sbx-1"); return err },
			seen{method: "DELETE", path: "/v1/sandboxes/sbx-1"}, false},
		{"pools", func(ctx context.Context, c *Client) error { _, err := c.Pools(ctx); return err },
			seen{method: "GET", path: "/v1/pools"}, false},
		{"exec", func(ctx context.Context, c *Client) error {
			_, err := c.Exec(ctx, "sbx-1", agentapi.ExecRequest{Argv: []string{"ls", "-la"}, TimeoutMS: 5000})
			return err
		}, seen{method: "POST", path: "/v1/sandboxes/sbx-1/exec", body: `{"argv":["ls","-la"],"timeout_ms":5000}`}, false},
		{"create session", func(ctx context.Context, c *Client) error {
			_, err := c.CreateSession(ctx, "sbx-1", agentapi.SessionCreateRequest{Cwd: "/tmp"})
			return err
		}, seen{method: "POST", path: "/v1/sandboxes/sbx-1/sessions", body: `{"cwd":"/tmp"}`}, false},
		{"list sessions", func(ctx context.Context, c *Client) error { _, err := c.ListSessions(ctx, "sbx-1"); return err },
			seen{method: "GET", path: "/v1/sandboxes/sbx-1/sessions"}, false},
		{"run session", func(ctx context.Context, c *Client) error {
			_, err := c.RunSession(ctx, "sbx-1", "ses-1", agentapi.SessionRunRequest{Command: "cd /tmp"})
			return err
		}, seen{method: "POST", path: "/v1/sandboxes/sbx-1/sessions/ses-1/run", body: `{"command":"cd /tmp"}`}, false},
		{"close session", func(ctx context.Context, c *Client) error { return c.CloseSession(ctx, "sbx-1", "ses-1") },
			seen{method: "DELETE", path: "/v1/sandboxes/sbx-1/sessions/ses-1"}, false},
		{"start process", func(ctx context.Context, c *Client) error {
			_, err := c.StartProcess(ctx, "sbx-1", agentapi.ProcessStartRequest{Command: "sleep 9", Stdin: true})
			return err
		}, seen{method: "POST", path: "/v1/sandboxes/sbx-1/processes", body: `{"command":"sleep 9","stdin":true}`}, false},
		{"list processes", func(ctx context.Context, c *Client) error { _, err := c.ListProcesses(ctx, "sbx-1"); return err },
			seen{method: "GET", path: "/v1/sandboxes/sbx-1/processes"}, false},
		{"get process", func(ctx context.Context, c *Client) error { _, err := c.GetProcess(ctx, "sbx-1", "p1"); return err },
			seen{method: "GET", path: "/v1/sandboxes/sbx-1/processes/p1"}, false},
		{"process output", func(ctx context.Context, c *Client) error {
			_, err := c.ProcessOutput(ctx, "sbx-1", "p1", 10, 100)
			return err
		}, seen{method: "GET", path: "/v1/sandboxes/sbx-1/processes/p1/output", query: "limit=100&offset=10"}, false},
		{"signal", func(ctx context.Context, c *Client) error { return c.Signal(ctx, "sbx-1", "p1", "TERM") },
			seen{method: "POST", path: "/v1/sandboxes/sbx-1/processes/p1/signal", body: `{"signal":"TERM"}`}, false},
		{"write stdin", func(ctx context.Context, c *Client) error {
			return c.WriteStdin(ctx, "sbx-1", "p1", strings.NewReader("input\n"), true)
		}, seen{method: "POST", path: "/v1/sandboxes/sbx-1/processes/p1/stdin", query: "close=true", contentType: "application/octet-stream", body: "input\n"}, false},
		{"kill process", func(ctx context.Context, c *Client) error { return c.KillProcess(ctx, "sbx-1", "p1") },
			seen{method: "DELETE", path: "/v1/sandboxes/sbx-1/processes/p1"}, false},
		{"kill all", func(ctx context.Context, c *Client) error { _, err := c.KillAll(ctx, "sbx-1"); return err },
			seen{method: "POST", path: "/v1/sandboxes/sbx-1/kill-all"}, false},
		{"read file", func(ctx context.Context, c *Client) error {
			rc, err := c.ReadFile(ctx, "sbx-1", "/x y", 5, 100)
			if err == nil {
				rc.Close()
			}
			return err
		}, seen{method: "GET", path: "/v1/sandboxes/sbx-1/files", query: "length=100&offset=5&path=%2Fx+y", accept: "application/octet-stream"}, false},
		{"write file", func(ctx context.Context, c *Client) error {
			_, err := c.WriteFile(ctx, "sbx-1", "rel/f", 0o755, strings.NewReader("data"))
			return err
		}, seen{method: "PUT", path: "/v1/sandboxes/sbx-1/files", query: "mode=0755&path=rel%2Ff", contentType: "application/octet-stream", body: "data"}, false},
		{"create file", func(ctx context.Context, c *Client) error {
			_, err := c.CreateFile(ctx, "sbx-1", "rel/f", 0, strings.NewReader("data"))
			return err
		}, seen{method: "PUT", path: "/v1/sandboxes/sbx-1/files", query: "exclusive=true&path=rel%2Ff", contentType: "application/octet-stream", body: "data"}, false},
		{"delete file", func(ctx context.Context, c *Client) error { return c.DeleteFile(ctx, "sbx-1", "/x") },
			seen{method: "DELETE", path: "/v1/sandboxes/sbx-1/files", query: "path=%2Fx"}, false},
		{"stat", func(ctx context.Context, c *Client) error { _, err := c.Stat(ctx, "sbx-1", "/x"); return err },
			seen{method: "GET", path: "/v1/sandboxes/sbx-1/files/stat", query: "path=%2Fx"}, false},
		{"list dir", func(ctx context.Context, c *Client) error { _, err := c.ListDir(ctx, "sbx-1", "/x"); return err },
			seen{method: "GET", path: "/v1/sandboxes/sbx-1/files/list", query: "path=%2Fx"}, false},
		{"upload archive", func(ctx context.Context, c *Client) error {
			_, err := c.UploadArchive(ctx, "sbx-1", "/dir", strings.NewReader("tar"))
			return err
		}, seen{method: "PUT", path: "/v1/sandboxes/sbx-1/files/archive", query: "path=%2Fdir", contentType: "application/octet-stream", body: "tar"}, false},
		{"download archive", func(ctx context.Context, c *Client) error {
			rc, err := c.DownloadArchive(ctx, "sbx-1", "/dir", true)
			if err == nil {
				rc.Close()
			}
			return err
		}, seen{method: "GET", path: "/v1/sandboxes/sbx-1/files/archive", query: "gzip=true&path=%2Fdir", accept: "application/octet-stream"}, false},
		{"create checkpoint", func(ctx context.Context, c *Client) error {
			_, err := c.CreateCheckpoint(ctx, "sbx-1", CreateCheckpointRequest{Paths: []string{"."}, Exclude: []string{".git"}, Labels: map[string]string{"s": "1"}})
			return err
		}, seen{method: "POST", path: "/v1/sandboxes/sbx-1/checkpoints", body: `{"paths":["."],"exclude":[".git"],"labels":{"s":"1"}}`}, false},
		{"list checkpoints", func(ctx context.Context, c *Client) error {
			_, err := c.ListCheckpoints(ctx, map[string]string{"b": "2", "a": "1"}, 5)
			return err
		}, seen{method: "GET", path: "/v1/checkpoints", query: "label=a%3D1&label=b%3D2&limit=5"}, false},
		{"get checkpoint", func(ctx context.Context, c *Client) error { _, err := c.GetCheckpoint(ctx, "ckp-1"); return err },
			seen{method: "GET", path: "/v1/checkpoints/ckp-1"}, false},
		{"delete checkpoint", func(ctx context.Context, c *Client) error { return c.DeleteCheckpoint(ctx, "ckp-1") },
			seen{method: "DELETE", path: "/v1/checkpoints/ckp-1"}, false},
		{"restore", func(ctx context.Context, c *Client) error {
			_, err := c.RestoreSandbox(ctx, "sbx-1", "ckp-1")
			return err
		},
			seen{method: "POST", path: "/v1/sandboxes/sbx-1/restore", body: `{"checkpoint":"ckp-1"}`}, false},
		{"fork", func(ctx context.Context, c *Client) error {
			_, err := c.ForkSandbox(ctx, "sbx-1", ForkRequest{Count: 8, LeaseSeconds: 60})
			return err
		}, seen{method: "POST", path: "/v1/sandboxes/sbx-1/fork", body: `{"count":8,"lease_seconds":60}`}, false},
		{"create from checkpoint", func(ctx context.Context, c *Client) error {
			_, err := c.CreateSandbox(ctx, CreateSandboxRequest{FromCheckpoint: "ckp-1"})
			return err
		}, seen{method: "POST", path: "/v1/sandboxes", body: `{"from_checkpoint":"ckp-1"}`}, false},
		{"id is escaped", func(ctx context.Context, c *Client) error { _, err := c.GetSandbox(ctx, "a/b c"); return err },
			seen{method: "GET", path: "/v1/sandboxes/a%2Fb%20c"}, false},
		{"health", func(ctx context.Context, c *Client) error { return c.Health(ctx) },
			seen{method: "GET", path: "/healthz", accept: "*/*"}, true},
		{"ready", func(ctx context.Context, c *Client) error { return c.Ready(ctx) },
			seen{method: "GET", path: "/readyz", accept: "*/*"}, true},
		{"openapi", func(ctx context.Context, c *Client) error { _, err := c.OpenAPI(ctx); return err },
			seen{method: "GET", path: "/openapi.json", accept: "*/*"}, true},
		{"metrics", func(ctx context.Context, c *Client) error { _, err := c.Metrics(ctx); return err },
			seen{method: "GET", path: "/metrics", accept: "*/*"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got seen
			c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				got = seen{method: r.Method, path: r.URL.EscapedPath(), query: r.URL.RawQuery,
					auth: r.Header.Get("Authorization"), accept: r.Header.Get("Accept"),
					contentType: r.Header.Get("Content-Type"), body: string(b)}
				_, _ = io.WriteString(w, "{}")
			})
			require.NoError(t, tt.call(testCtx(t), c))

			want := tt.want
			if want.accept == "" {
				want.accept = "application/json"
			}
			if want.contentType == "" && want.body != "" {
				want.contentType = "application/json"
			}
			if tt.noAuth {
				assert.Empty(t, got.auth, "no auth on this route")
			} else {
				assert.Equal(t, "Bearer "+testKey, got.auth)
			}
			got.auth = ""
			if want.contentType == "application/json" {
				assert.JSONEq(t, want.body, got.body)
				got.body = want.body
			}
			assert.Equal(t, want, got)
		})
	}
}

func TestClient_EmptyIDs_RefusedNamingTheField(t *testing.T) {
	tests := []struct {
		name  string
		call  func(ctx context.Context, c *Client) error
		field string
	}{
		{"sandbox", func(ctx context.Context, c *Client) error { _, err := c.GetSandbox(ctx, ""); return err }, "sandbox id"},
		{"session", func(ctx context.Context, c *Client) error { return c.CloseSession(ctx, "sbx-1", "") }, "session id"},
		{"process", func(ctx context.Context, c *Client) error { return c.KillProcess(ctx, "sbx-1", "") }, "process id"},
		{"sandbox before process", func(ctx context.Context, c *Client) error { return c.KillProcess(ctx, "", "") }, "sandbox id"},
		{"file path", func(ctx context.Context, c *Client) error { _, err := c.Stat(ctx, "sbx-1", ""); return err }, "path"},
		{"checkpoint", func(ctx context.Context, c *Client) error { return c.DeleteCheckpoint(ctx, "") }, "checkpoint id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			called := false
			c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) { called = true })
			err := tt.call(testCtx(t), c)
			require.Error(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), tt.field+": "), err.Error())
			assert.False(t, called, "no request is sent")
		})
	}
}

func TestClient_CreateSandbox_IdempotencyKeyHeader(t *testing.T) {
	tests := []struct {
		name string
		key  string
	}{
		{"with key", "retry-123"},
		{"without key", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			var body map[string]any
			c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
				got = r.Header.Values("Idempotency-Key")
				_ = json.NewDecoder(r.Body).Decode(&body)
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, `{"id":"sbx-1","pool":"default","state":"active","generation":3,
					"created_at":"2026-01-02T03:04:05Z","expires_at":"2026-01-02T03:14:05Z","lease_seconds":600,"labels":{"run":"x"}}`)
			})
			sb, err := c.CreateSandbox(testCtx(t), CreateSandboxRequest{Pool: "default", IdempotencyKey: tt.key})
			require.NoError(t, err)
			if tt.key == "" {
				assert.Empty(t, got)
			} else {
				assert.Equal(t, []string{tt.key}, got)
			}
			assert.Equal(t, map[string]any{"pool": "default"}, body, "the key is a header, not a body field")
			assert.Equal(t, Sandbox{ID: "sbx-1", Pool: "default", State: StateActive, Generation: 3,
				CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), ExpiresAt: time.Date(2026, 1, 2, 3, 14, 5, 0, time.UTC),
				LeaseSeconds: 600, Labels: map[string]string{"run": "x"}}, sb)
		})
	}
}

func TestClient_Errors_DecodedIntoTypedError(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		header  map[string]string
		body    string
		want    *Error
		is      func(error) bool
		isNot   []func(error) bool
		wantMsg string
	}{
		{"not found", 404, nil, `{"error":{"code":"not_found","message":"sandbox sbx-9 not found"}}`,
			&Error{Status: 404, Code: "not_found", Message: "sandbox sbx-9 not found"}, IsNotFound,
			[]func(error) bool{IsGone, IsConflict}, "sandbox sbx-9 not found (404 not_found)"},
		{"gone", 410, nil, `{"error":{"code":"gone","message":"lease expired at 12:00"}}`,
			&Error{Status: 410, Code: "gone", Message: "lease expired at 12:00"}, IsGone, []func(error) bool{IsNotFound}, ""},
		{"bad request", 400, nil, `{"error":{"code":"bad_request","message":"lease_seconds: must be between 1 and 86400"}}`,
			&Error{Status: 400, Code: "bad_request", Message: "lease_seconds: must be between 1 and 86400"}, IsBadRequest, nil, ""},
		{"unauthorized", 401, nil, `{"error":{"code":"unauthorized","message":"missing API key"}}`,
			&Error{Status: 401, Code: "unauthorized", Message: "missing API key"}, IsUnauthorized, nil, ""},
		{"busy", 409, nil, `{"error":{"code":"busy","message":"session ses-1 is running a command"}}`,
			&Error{Status: 409, Code: "busy", Message: "session ses-1 is running a command"}, IsBusy, nil, ""},
		{"busy is a conflict", 409, nil, `{"error":{"code":"busy","message":"m"}}`,
			&Error{Status: 409, Code: "busy", Message: "m"}, IsConflict, nil, ""},
		{"too large", 413, nil, `{"error":{"code":"payload_too_large","message":"body over 1 MiB"}}`,
			&Error{Status: 413, Code: "payload_too_large", Message: "body over 1 MiB"}, IsTooLarge, nil, ""},
		{"agent unreachable", 502, nil, `{"error":{"code":"agent_unreachable","message":"no answer"}}`,
			&Error{Status: 502, Code: "agent_unreachable", Message: "no answer"}, IsAgentUnreachable, nil, ""},
		{"no capacity with retry-after", 503, map[string]string{"Retry-After": "7"}, `{"error":{"code":"no_capacity","message":"pool default is at max_total 4"}}`,
			&Error{Status: 503, Code: "no_capacity", Message: "pool default is at max_total 4", RetryAfter: 7 * time.Second}, IsNoCapacity,
			nil, ""},
		{"no capacity is unavailable", 503, nil, `{"error":{"code":"no_capacity","message":"m"}}`,
			&Error{Status: 503, Code: "no_capacity", Message: "m"}, IsUnavailable, nil, ""},
		{"not the error shape", 502, nil, "<html>bad\ngateway</html>\n",
			&Error{Status: 502, Code: "Bad Gateway", Message: "<html>bad gateway</html>"}, func(err error) bool { return !IsAgentUnreachable(err) },
			nil, "<html>bad gateway</html> (502 Bad Gateway)"},
		{"status alone decides", 404, nil, "",
			&Error{Status: 404, Code: "Not Found", Message: ""}, IsNotFound, nil, "Not Found (404 Not Found)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
				for k, v := range tt.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			})
			_, err := c.GetSandbox(testCtx(t), "sbx-9")
			require.Error(t, err)
			var e *Error
			require.ErrorAs(t, err, &e)
			assert.Equal(t, tt.want, e)
			wrapped := fmt.Errorf("get sandbox: %w", err)
			assert.True(t, tt.is(wrapped), "helper sees through wrapping")
			for _, f := range tt.isNot {
				assert.False(t, f(wrapped))
			}
			if tt.wantMsg != "" {
				assert.Equal(t, tt.wantMsg, err.Error())
			}
		})
	}
}

func TestClient_Call_BoundedByContext(t *testing.T) {
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // the server notices a gone client only after the body
		<-r.Context().Done()               // answers never; the client's ctx must end the wait
	})
	ctx, cancel := context.WithTimeout(testCtx(t), 50*time.Millisecond)
	defer cancel()
	_, err := c.Exec(ctx, "sbx-1", agentapi.ExecRequest{Command: "sleep 1000"})
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestClient_Answer_OverMaxResponseBytesFails(t *testing.T) {
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, `{"stdout":%q}`, strings.Repeat("x", 200))
	}, WithMaxResponseBytes(100))
	_, err := c.Exec(testCtx(t), "sbx-1", agentapi.ExecRequest{Command: "yes"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "answer exceeds 100 bytes")
}

// sseHandler writes pieces of an event stream, flushing after each.
func sseHandler(pieces ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // so that r.Context ends when the client goes away
		w.Header().Set("Content-Type", "text/event-stream")
		for _, p := range pieces {
			_, _ = io.WriteString(w, p)
			_ = http.NewResponseController(w).Flush()
		}
	}
}

// drain reads a stream to its end and returns its events and the error that ended it.
func drain[E any](s *Stream[E]) ([]E, error) {
	var evs []E
	for {
		ev, err := s.Next()
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
	}
}

func TestClient_ExecStream_Outcomes(t *testing.T) {
	tests := []struct {
		name    string
		pieces  []string
		want    []ExecEvent
		wantErr func(t *testing.T, err error)
	}{
		{
			name: "keep-alives and chunked arrival",
			pieces: []string{": keep-alive\n\n", "event: std", "out\ndata: {\"da", "ta\":\"hel\"}\n", "\n",
				": keep-alive\n\n", "event: stderr\r\ndata: {\"data\":\"oops\\n\"}\r\n\r\n",
				"event: stdout\ndata: {\"data\":\"lo\"}\n\n", "event: exit\ndata: {\"exit_code\":3,\"duration_ms\":12}\n\n"},
			want: []ExecEvent{{Type: "stdout", Data: "hel"}, {Type: "stderr", Data: "oops\n"}, {Type: "stdout", Data: "lo"},
				{Type: "exit", Result: agentapi.ExecResult{ExitCode: 3, DurationMS: 12}}},
			wantErr: func(t *testing.T, err error) { assert.ErrorIs(t, err, io.EOF) },
		},
		{
			name:    "unknown events are skipped",
			pieces:  []string{"event: progress\ndata: {}\n\n", "data: plain message\n\n", "event: exit\ndata: {\"exit_code\":-1,\"signal\":\"SIGKILL\",\"timed_out\":true}\n\n"},
			want:    []ExecEvent{{Type: "exit", Result: agentapi.ExecResult{ExitCode: -1, Signal: "SIGKILL", TimedOut: true}}},
			wantErr: func(t *testing.T, err error) { assert.ErrorIs(t, err, io.EOF) },
		},
		{
			name:   "stream cut before exit",
			pieces: []string{"event: stdout\ndata: {\"data\":\"a\"}\n\n", "event: stdout\ndata: {\"data\":\"b\"}"},
			want:   []ExecEvent{{Type: "stdout", Data: "a"}},
			wantErr: func(t *testing.T, err error) {
				assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
			},
		},
		{
			name:   "error event",
			pieces: []string{"event: stdout\ndata: {\"data\":\"a\"}\n\n", "event: error\ndata: {\"code\":\"agent_unreachable\",\"message\":\"agent went away\"}\n\n"},
			want:   []ExecEvent{{Type: "stdout", Data: "a"}},
			wantErr: func(t *testing.T, err error) {
				var e *Error
				require.ErrorAs(t, err, &e)
				assert.Equal(t, &Error{Code: "agent_unreachable", Message: "agent went away"}, e)
				assert.True(t, IsAgentUnreachable(err))
			},
		},
		{
			name:   "bad event data",
			pieces: []string{"event: exit\ndata: {not json\n\n"},
			wantErr: func(t *testing.T, err error) {
				assert.ErrorContains(t, err, "decode exit event")
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var accept string
			h := sseHandler(tt.pieces...)
			c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
				accept = r.Header.Get("Accept")
				h(w, r)
			})
			s, err := c.ExecStream(testCtx(t), "sbx-1", agentapi.ExecRequest{Command: "x"})
			require.NoError(t, err)
			defer s.Close()
			evs, err := drain(s)
			assert.Equal(t, "text/event-stream", accept)
			assert.Equal(t, tt.want, evs)
			tt.wantErr(t, err)
			_, err = s.Next()
			assert.ErrorIs(t, err, io.EOF, "a finished stream stays finished")
		})
	}
}

func TestClient_ExecStream_ErrorStatusBeforeStream(t *testing.T) {
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusGone)
		_, _ = io.WriteString(w, `{"error":{"code":"gone","message":"lease released"}}`)
	})
	_, err := c.ExecStream(testCtx(t), "sbx-1", agentapi.ExecRequest{Command: "x"})
	assert.True(t, IsGone(err), "got %v", err)
}

// TestClient_ExecStream_EventsArriveBeforeCommandEnds shows the stream is not
// buffered: the first event is read while the server still holds the stream open.
func TestClient_ExecStream_EventsArriveBeforeCommandEnds(t *testing.T) {
	release := make(chan struct{})
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		sseHandler("event: stdout\ndata: {\"data\":\"first\"}\n\n")(w, r)
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		sseHandler("event: exit\ndata: {\"exit_code\":0}\n\n")(w, r)
	})
	s, err := c.ExecStream(testCtx(t), "sbx-1", agentapi.ExecRequest{Command: "x"})
	require.NoError(t, err)
	defer s.Close()
	ev, err := s.Next()
	require.NoError(t, err)
	assert.Equal(t, ExecEvent{Type: "stdout", Data: "first"}, ev)
	close(release)
	ev, err = s.Next()
	require.NoError(t, err)
	assert.Equal(t, "exit", ev.Type)
}

func TestClient_FollowOutput_StreamsUntilExit(t *testing.T) {
	var query, accept string
	h := sseHandler("event: output\ndata: {\"data\":\"line1\\n\",\"offset\":100}\n\n", ": keep-alive\n\n",
		"event: output\ndata: {\"data\":\"line2\\n\",\"offset\":106}\n\n",
		"event: exit\ndata: {\"id\":\"p1\",\"pid\":42,\"state\":\"exited\",\"exit_code\":0,\"started_at\":\"2026-01-02T03:04:05Z\",\"output_bytes\":112}\n\n")
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		query, accept = r.URL.RawQuery, r.Header.Get("Accept")
		h(w, r)
	})
	s, err := c.FollowOutput(testCtx(t), "sbx-1", "p1", 100)
	require.NoError(t, err)
	defer s.Close()
	evs, err := drain(s)
	assert.ErrorIs(t, err, io.EOF)
	zero := 0
	assert.Equal(t, []OutputEvent{
		{Type: "output", Chunk: agentapi.StreamChunk{Data: "line1\n", Offset: 100}},
		{Type: "output", Chunk: agentapi.StreamChunk{Data: "line2\n", Offset: 106}},
		{Type: "exit", Process: agentapi.ProcessInfo{ID: "p1", PID: 42, State: "exited", ExitCode: &zero,
			StartedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), OutputBytes: 112}},
	}, evs)
	assert.Equal(t, "follow=true&offset=100", query)
	assert.Equal(t, "text/event-stream", accept)
}

// TestClient_UploadArchive_StreamsBody shows the upload is not buffered: the
// server reads the first part while the caller has not written the rest.
func TestClient_UploadArchive_StreamsBody(t *testing.T) {
	gotFirst := make(chan string, 1)
	var rest []byte
	var contentLength int64
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		contentLength = r.ContentLength
		first := make([]byte, 5)
		if _, err := io.ReadFull(r.Body, first); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		gotFirst <- string(first)
		rest, _ = io.ReadAll(r.Body)
		_, _ = fmt.Fprintf(w, `{"path":"/dir","bytes":%d,"entries":2}`, 5+len(rest))
	})
	pr, pw := io.Pipe()
	var wg sync.WaitGroup
	var writeErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, writeErr = io.WriteString(pw, "first"); writeErr != nil {
			pw.CloseWithError(writeErr)
			return
		}
		select {
		case first := <-gotFirst:
			_, writeErr = io.WriteString(pw, "|after "+first)
			pw.CloseWithError(writeErr)
		case <-time.After(waitTimeout):
			pw.CloseWithError(errors.New("server never saw the first part"))
		}
	}()
	res, err := c.UploadArchive(testCtx(t), "sbx-1", "/dir", pr)
	wg.Wait()
	require.NoError(t, writeErr)
	require.NoError(t, err)
	assert.Equal(t, "|after first", string(rest))
	assert.Equal(t, agentapi.WriteResult{Path: "/dir", Bytes: 17, Entries: 2}, res)
	assert.Equal(t, int64(-1), contentLength, "a stream of unknown length is chunked")
}

// TestClient_DownloadArchive_StreamsBody shows the download is handed over
// as it arrives.
func TestClient_DownloadArchive_StreamsBody(t *testing.T) {
	release := make(chan struct{})
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "part1")
		_ = http.NewResponseController(w).Flush()
		select {
		case <-release:
			_, _ = io.WriteString(w, "part2")
		case <-r.Context().Done():
		}
	})
	rc, err := c.DownloadArchive(testCtx(t), "sbx-1", "/dir", false)
	require.NoError(t, err)
	defer rc.Close()
	first := make([]byte, 5)
	_, err = io.ReadFull(rc, first)
	require.NoError(t, err)
	assert.Equal(t, "part1", string(first))
	close(release)
	rest, err := io.ReadAll(rc)
	require.NoError(t, err)
	assert.Equal(t, "part2", string(rest))
}

func TestClient_WriteFile_FileBodyHasContentLength(t *testing.T) {
	p := t.TempDir() + "/f"
	require.NoError(t, os.WriteFile(p, []byte("0123456789"), 0o600))
	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	_, err = f.Seek(4, io.SeekStart)
	require.NoError(t, err)

	var contentLength int64
	var body string
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		contentLength = r.ContentLength
		b, _ := io.ReadAll(r.Body)
		body = string(b)
		_, _ = io.WriteString(w, `{"path":"/f","bytes":6}`)
	})
	res, err := c.WriteFile(testCtx(t), "sbx-1", "/f", 0, f)
	require.NoError(t, err)
	assert.Equal(t, int64(6), contentLength)
	assert.Equal(t, "456789", body)
	assert.Equal(t, agentapi.WriteResult{Path: "/f", Bytes: 6}, res)
}

func TestClient_ExecStream_EventOverMaxResponseBytesFails(t *testing.T) {
	c := newTestClient(t, sseHandler("event: stdout\ndata: {\"data\":\"small\"}\n\n",
		"event: stdout\ndata: {\"data\":\""+strings.Repeat("x", 500)+"\"}\n\n"), WithMaxResponseBytes(200))
	s, err := c.ExecStream(testCtx(t), "sbx-1", agentapi.ExecRequest{Command: "x"})
	require.NoError(t, err)
	defer s.Close()
	evs, err := drain(s)
	assert.Equal(t, []ExecEvent{{Type: "stdout", Data: "small"}}, evs)
	assert.ErrorIs(t, err, agentapi.ErrEventTooLarge)
}
