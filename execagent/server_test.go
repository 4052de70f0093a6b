package execagent

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

func TestServer_Auth_EveryRouteRequiresToken(t *testing.T) {
	a := newTestAgent(t, nil)
	routes := []struct{ method, path string }{
		{http.MethodGet, agentapi.RouteHealth},
		{http.MethodPost, agentapi.RouteInit},
		{http.MethodPost, agentapi.RouteExec},
		{http.MethodPost, agentapi.RouteSessions},
		{http.MethodGet, agentapi.RouteSessions},
		{http.MethodPost, "/v1/sessions/x/run"},
		{http.MethodDelete, "/v1/sessions/x"},
		{http.MethodPost, agentapi.RouteProcesses},
		{http.MethodGet, "/v1/processes/x/output"},
		{http.MethodGet, agentapi.RouteFiles + "?path=/etc/hostname"},
		{http.MethodPut, agentapi.RouteFileArchive + "?path=x"},
		{http.MethodGet, "/no/such/route"},
	}
	auths := []struct {
		name   string
		header string
	}{
		{"missing", ""},
		{"wrong token", "Bearer wrong"},
		{"token prefix", "Bearer " + testToken[:len(testToken)-1]},
		{"not bearer", "Basic " + testToken},
	}
	for _, rt := range routes {
		for _, au := range auths {
			t.Run(rt.method+" "+rt.path+" "+au.name, func(t *testing.T) {
				req, err := http.NewRequest(rt.method, a.url+rt.path, strings.NewReader("{}"))
				require.NoError(t, err)
				if au.header != "" {
					req.Header.Set("Authorization", au.header)
				}
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
				var eb agentapi.ErrorBody
				require.NoError(t, json.NewDecoder(resp.Body).Decode(&eb))
				assert.Equal(t, agentapi.CodeUnauthorized, eb.Error.Code)
			})
		}
	}
}

func TestServer_Health_ReportsVersionAndGeneration(t *testing.T) {
	a := newTestAgent(t, nil)
	h, err := a.client.Health(context.Background())
	require.NoError(t, err)
	assert.Equal(t, "ok", h.Status)
	assert.Equal(t, agentapi.Version, h.Version)
	assert.Equal(t, int64(0), h.Generation)
	assert.Empty(t, h.LeaseID)
}

func TestServer_UnknownRoute_ErrorBody(t *testing.T) {
	a := newTestAgent(t, nil)
	err := a.client.Do(context.Background(), http.MethodGet, "/v1/nope", nil, nil)
	ae := apiError(t, err)
	assert.Equal(t, http.StatusNotFound, ae.Status)
	assert.Equal(t, agentapi.CodeNotFound, ae.Code)
	err = a.client.Do(context.Background(), http.MethodGet, agentapi.RouteExec, nil, nil)
	assert.Equal(t, http.StatusNotFound, apiError(t, err).Status)
}

func TestServer_Init_GenerationFencing(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	c := a.client

	h, err := c.Init(ctx, agentapi.InitRequest{LeaseID: "lease-1", Generation: 3, Env: map[string]string{"LEASE_VAR": "one"}})
	require.NoError(t, err)
	assert.Equal(t, int64(3), h.Generation)
	assert.Equal(t, "lease-1", h.LeaseID)

	t.Run("same generation and lease is an idempotent retry", func(t *testing.T) {
		h, err := c.Init(ctx, agentapi.InitRequest{LeaseID: "lease-1", Generation: 3, Env: map[string]string{"LEASE_VAR": "one"}})
		require.NoError(t, err)
		assert.Equal(t, int64(3), h.Generation)
	})
	t.Run("same generation with another lease is a conflict", func(t *testing.T) {
		_, err := c.Init(ctx, agentapi.InitRequest{LeaseID: "lease-2", Generation: 3})
		ae := apiError(t, err)
		assert.Equal(t, http.StatusConflict, ae.Status)
		assert.Equal(t, agentapi.CodeConflict, ae.Code)
	})
	t.Run("lower generation init is stale", func(t *testing.T) {
		_, err := c.Init(ctx, agentapi.InitRequest{LeaseID: "lease-0", Generation: 2})
		ae := apiError(t, err)
		assert.Equal(t, http.StatusConflict, ae.Status)
		assert.Equal(t, agentapi.CodeStaleGeneration, ae.Code)
	})
	t.Run("requests of a lower generation are refused", func(t *testing.T) {
		for _, gen := range []int64{0, 2} { // 0: no header
			_, err := c.WithGeneration(gen).Exec(ctx, agentapi.ExecRequest{Command: "true"})
			ae := apiError(t, err)
			assert.Equal(t, http.StatusConflict, ae.Status)
			assert.Equal(t, agentapi.CodeStaleGeneration, ae.Code)
		}
	})
	t.Run("current and higher generations pass and see the lease env", func(t *testing.T) {
		for _, gen := range []int64{3, 4} {
			res, err := c.WithGeneration(gen).Exec(ctx, agentapi.ExecRequest{Command: "echo $LEASE_VAR"})
			require.NoError(t, err)
			assert.Equal(t, "one\n", res.Stdout)
		}
	})
	t.Run("healthz is never fenced", func(t *testing.T) {
		h, err := c.Health(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(3), h.Generation)
	})
	t.Run("a higher generation fences the old one and replaces the env", func(t *testing.T) {
		_, err := c.Init(ctx, agentapi.InitRequest{LeaseID: "lease-2", Generation: 5, Env: map[string]string{"OTHER": "two"}})
		require.NoError(t, err)
		_, err = c.WithGeneration(3).Exec(ctx, agentapi.ExecRequest{Command: "true"})
		assert.Equal(t, agentapi.CodeStaleGeneration, apiError(t, err).Code)
		res, err := c.WithGeneration(5).Exec(ctx, agentapi.ExecRequest{Command: "echo ${LEASE_VAR:-unset} $OTHER"})
		require.NoError(t, err)
		assert.Equal(t, "unset two\n", res.Stdout)
	})
}

func TestServer_BadInput_NamesTheField(t *testing.T) {
	a := newTestAgent(t, func(c *Config) { c.MaxJSONBody = 1 << 10 })
	ctx := context.Background()
	tests := []struct {
		name   string
		path   string
		body   any
		status int
		field  string
	}{
		{"exec without command", agentapi.RouteExec, agentapi.ExecRequest{}, 400, "command"},
		{"exec with both", agentapi.RouteExec, agentapi.ExecRequest{Command: "x", Argv: []string{"x"}}, 400, "command"},
		{"exec negative timeout", agentapi.RouteExec, agentapi.ExecRequest{Command: "x", TimeoutMS: -1}, 400, "timeout_ms"},
		{"exec timeout over max", agentapi.RouteExec, agentapi.ExecRequest{Command: "x", TimeoutMS: 1 << 50}, 400, "timeout_ms"},
		{"exec output cap over max", agentapi.RouteExec, agentapi.ExecRequest{Command: "x", MaxOutputBytes: 1 << 40}, 400, "max_output_bytes"},
		{"exec missing cwd", agentapi.RouteExec, agentapi.ExecRequest{Command: "x", Cwd: "/no/such/dir"}, 400, "cwd"},
		{"exec bad env name", agentapi.RouteExec, agentapi.ExecRequest{Command: "x", Env: map[string]string{"A=B": "c"}}, 400, "env"},
		{"exec unknown program", agentapi.RouteExec, agentapi.ExecRequest{Argv: []string{"no-such-program-xyz"}}, 400, "argv[0]"},
		{"exec wrong type", agentapi.RouteExec, map[string]any{"command": 5}, 400, "command"},
		{"exec body too large", agentapi.RouteExec, agentapi.ExecRequest{Command: strings.Repeat("x", 2048)}, 413, ""},
		{"init negative generation", agentapi.RouteInit, agentapi.InitRequest{Generation: -1}, 400, "generation"},
		{"signal unknown", "/v1/processes/none/signal", agentapi.SignalRequest{Signal: "TERM"}, 404, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := a.client.Do(ctx, http.MethodPost, tt.path, tt.body, nil)
			ae := apiError(t, err)
			assert.Equal(t, tt.status, ae.Status, ae.Message)
			if tt.field != "" {
				assert.True(t, strings.HasPrefix(ae.Message, tt.field), "message %q should name %q", ae.Message, tt.field)
				assert.Equal(t, agentapi.CodeBadRequest, ae.Code)
			}
		})
	}
	t.Run("invalid JSON", func(t *testing.T) {
		req, err := a.client.NewRequest(ctx, http.MethodPost, agentapi.RouteExec, strings.NewReader("{nope"))
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	})
	t.Run("bad generation header", func(t *testing.T) {
		req, err := a.client.NewRequest(ctx, http.MethodGet, agentapi.RouteSessions, nil)
		require.NoError(t, err)
		req.Header.Set(agentapi.HeaderGeneration, "abc")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	})
}

func TestConfig_Validate_NamesTheVariable(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"no token", func(c *Config) { c.Token = "" }, "QUARRY_AGENT_TOKEN"},
		{"relative workdir", func(c *Config) { c.Workdir = "rel" }, "QUARRY_AGENT_WORKDIR"},
		{"missing workdir", func(c *Config) { c.Workdir = dir + "/missing" }, "QUARRY_AGENT_WORKDIR"},
		{"missing shell", func(c *Config) { c.Shell = "/no/shell" }, "QUARRY_AGENT_SHELL"},
		{"negative timeout", func(c *Config) { c.MaxTimeout = -1 }, "QUARRY_AGENT_MAX_TIMEOUT"},
		{"default above max", func(c *Config) { c.DefaultOutputBytes = c.MaxOutputBytes + 1 }, "QUARRY_AGENT_DEFAULT_OUTPUT_BYTES"},
		{"relative owner dir", func(c *Config) { c.OwnerDir = "task" }, "QUARRY_AGENT_OWNER_DIR"},
		{"missing owner dir", func(c *Config) { c.OwnerDir = dir + "/missing" }, "QUARRY_AGENT_OWNER_DIR"},
		{"owner dir a file", func(c *Config) { c.OwnerDir = file }, "QUARRY_AGENT_OWNER_DIR"},
		{"negative owner check interval", func(c *Config) { c.OwnerCheckInterval = -1 }, "QUARRY_AGENT_OWNER_CHECK_INTERVAL"},
		{"negative idle exit", func(c *Config) { c.IdleExit = -time.Second }, "QUARRY_AGENT_IDLE_EXIT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Token, c.Workdir = "t", dir
			tt.mutate(&c)
			err := c.Validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	c := DefaultConfig()
	c.Token, c.Workdir = "t", dir
	assert.NoError(t, c.Validate())
	c.OwnerDir = dir
	assert.NoError(t, c.Validate())
}

func TestServer_JSONBodies_UnknownFieldsRefused(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	ses, err := a.client.CreateSession(ctx, agentapi.SessionCreateRequest{})
	require.NoError(t, err)
	proc, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Command: "cat", RPC: true})
	require.NoError(t, err)
	tests := []struct {
		name, path, body, field string
	}{
		{"exec", agentapi.RouteExec, `{"command":"sleep 3","timeout":1}`, "timeout"},
		{"exec wrong case is the same field", agentapi.RouteExec, `{"Command":"true","stdout":"x"}`, "stdout"},
		{"session create", agentapi.RouteSessions, `{"cwd":"","shell":"zsh"}`, "shell"},
		{"session run", "/v1/sessions/" + ses.ID + "/run", `{"command":"sleep 3","timeout":1}`, "timeout"},
		{"process start", agentapi.RouteProcesses, `{"command":"true","detach":true}`, "detach"},
		{"signal", "/v1/processes/" + proc.ID + "/signal", `{"signal":"KILL","group":false}`, "group"},
		{"call", "/v1/processes/" + proc.ID + "/call", `{"request":1,"timeout":5}`, "timeout"},
		{"init", agentapi.RouteInit, `{"lease_id":"l","gen":2}`, "gen"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := a.client.DoRaw(ctx, http.MethodPost, tt.path, strings.NewReader(tt.body), nil)
			ae := apiError(t, err)
			assert.Equal(t, http.StatusBadRequest, ae.Status, ae.Message)
			assert.Equal(t, agentapi.CodeBadRequest, ae.Code)
			assert.True(t, strings.HasPrefix(ae.Message, tt.field+": unknown field"), "message %q should name %q", ae.Message, tt.field)
		})
	}
	// Nothing was started or signaled by the refused requests.
	pi, err := a.client.GetProcess(ctx, proc.ID)
	require.NoError(t, err)
	assert.Equal(t, agentapi.ProcessRunning, pi.State)
	procs, err := a.client.ListProcesses(ctx)
	require.NoError(t, err)
	assert.Len(t, procs, 1)
}

func TestServer_Env_OneValidatorForEveryRoute(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	bad := map[string]string{"1x": "v"}
	tests := []struct {
		name string
		path string
		body any
	}{
		{"exec", agentapi.RouteExec, agentapi.ExecRequest{Command: "true", Env: bad}},
		{"process", agentapi.RouteProcesses, agentapi.ProcessStartRequest{Command: "true", Env: bad}},
		{"session", agentapi.RouteSessions, agentapi.SessionCreateRequest{Env: bad}},
		{"init", agentapi.RouteInit, agentapi.InitRequest{LeaseID: "l", Env: bad}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := a.client.Do(ctx, http.MethodPost, tt.path, tt.body, nil)
			ae := apiError(t, err)
			assert.Equal(t, http.StatusBadRequest, ae.Status, ae.Message)
			assert.Equal(t, `env: "1x" is not a variable name (letters, digits and _, not starting with a digit)`, ae.Message)
		})
	}
}

func TestServer_Close_RunningCommandsAnswerGone(t *testing.T) {
	const started = "touch started; "
	tests := []struct {
		name string
		// call starts a command that touches "started" in the workdir and
		// then blocks; it returns the error its caller sees after Close.
		call func(ctx context.Context, a *testAgent) error
	}{
		{"exec", func(ctx context.Context, a *testAgent) error {
			_, err := a.client.Exec(ctx, agentapi.ExecRequest{Command: started + "sleep 1000"})
			return err
		}},
		{"exec stream", func(ctx context.Context, a *testAgent) error {
			st, err := a.client.ExecStream(ctx, agentapi.ExecRequest{Command: started + "echo first; sleep 1000"})
			if err != nil {
				return err
			}
			defer st.Close()
			for {
				ev, err := st.Next()
				if err != nil {
					return err
				}
				switch ev.Name {
				case agentapi.EventError:
					var d agentapi.ErrorDetail
					if err := ev.Decode(&d); err != nil {
						return err
					}
					return &agentapi.Error{Status: http.StatusGone, Code: d.Code, Message: d.Message}
				case agentapi.EventExit:
					return nil
				}
			}
		}},
		{"session run", func(ctx context.Context, a *testAgent) error {
			info, err := a.client.CreateSession(ctx, agentapi.SessionCreateRequest{})
			if err != nil {
				return err
			}
			_, err = a.client.RunSession(ctx, info.ID, agentapi.SessionRunRequest{Command: started + "sleep 1000"})
			return err
		}},
		{"rpc call", func(ctx context.Context, a *testAgent) error {
			p, err := a.client.StartProcess(ctx, agentapi.ProcessStartRequest{Command: "read line; " + started + "sleep 1000", RPC: true})
			if err != nil {
				return err
			}
			_, err = a.client.CallProcess(ctx, p.ID, agentapi.ProcessCallRequest{Request: json.RawMessage(`{"step":1}`)})
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newTestAgent(t, nil)
			ctx, cancel := context.WithTimeout(context.Background(), waitLong)
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- tt.call(ctx, a) }()
			eventually(t, func() bool {
				_, err := os.Stat(filepath.Join(a.cfg.Workdir, "started"))
				return err == nil
			}, "the command did not start")
			require.NoError(t, a.srv.Close(ctx))
			ae := apiError(t, <-errc)
			assert.Equal(t, http.StatusGone, ae.Status, ae.Message)
			assert.Equal(t, agentapi.CodeGone, ae.Code)
			assert.Contains(t, ae.Message, "the sandbox is shutting down")
		})
	}
}
