package execagent

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

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
}
