package gateway

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent"
	"github.com/quarryhq/quarry/modelservice"
	"github.com/quarryhq/quarry/modelservice/modeltest"
)

// serveRelaySocket serves e's relay socket in a fresh directory and returns
// its path; the gateway is shut down when the test ends.
func serveRelaySocket(t *testing.T, e *relayEnv) string {
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(socketDir(t), "relay.sock"))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- e.ServeRelay(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
		defer cancel()
		assert.NoError(t, e.Shutdown(ctx))
		assert.NoError(t, <-done)
	})
	return ln.Addr().String()
}

// A sandbox's program calls its agent, which forwards to the relay socket:
// the trainer answers, and when the program leaves, the gateway notices
// through the agent and cancels the request.
func TestServeRelay_ThroughTheAgentsForwarder(t *testing.T) {
	e := startRelay(t, nil, nil, modelservice.Config{})
	sock := serveRelaySocket(t, e)
	agent := startAgent(t, func(c *execagent.Config) { c.RelaySocket = sock })
	id, token := e.sandbox("sbx-1", testKey, "default", nil)
	url := agent.URL + "/v1/sandboxes/" + id + "/model/v1/chat/completions"

	res := agentCall(context.Background(), url, token, []byte(`{"stream":true}`))
	r := e.claim(t, testKey, 1, "")[0]
	resp, b := e.respond(t, testKey, r.ID, "", "application/json", modeltest.ChatCompletion("c", "m", "through the agent"))
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	got := <-res
	require.NoError(t, got.err)
	assert.Equal(t, http.StatusOK, got.status, "%s", got.body)
	assert.Contains(t, string(got.body), "through the agent")
	assert.Contains(t, string(got.body), "data: [DONE]", "streamed as server-sent events")

	ctx, cancel := context.WithCancel(context.Background())
	res = agentCall(ctx, url, token, []byte(`{}`))
	e.claim(t, testKey, 1, "")
	cancel()
	<-res
	eventually(t, func() bool {
		page, _, err := e.svc.Transcript(context.Background(), id, OwnerOf(testKey), "", 10)
		require.NoError(t, err)
		return len(page) == 2 && page[1].State == modelservice.StateCancelled
	}, "the gateway notices, through the agent and the socket, that the program left")
}

// The relay socket serves the relay's sandbox routes, authenticated by relay
// tokens, and nothing else, not even to an API key.
func TestServeRelay_OnlyTheRelaysSandboxRoutes(t *testing.T) {
	e := startRelay(t, nil, nil, modelservice.Config{})
	id, token := e.sandbox("sbx-1", testKey, "default", nil)
	sock := serveRelaySocket(t, e)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	get := func(path, auth string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, "http://relay"+path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+auth)
		resp, err := hc.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	status, body := get("/v1/sandboxes/"+id+"/model/v1/models", token)
	assert.Equal(t, http.StatusOK, status, body)
	status, body = get("/v1/sandboxes/"+id+"/model/v1/models", "wrong")
	assert.Equal(t, http.StatusUnauthorized, status, body)
	for _, p := range []string{"/v1/pools", "/v1/sandboxes", "/v1/sandboxes/" + id + "/model/transcript", "/metrics", "/v1/model/requests"} {
		status, body = get(p, testKey)
		assert.Equal(t, http.StatusNotFound, status, "%s: %s", p, body)
		assert.True(t, strings.Contains(body, "relay socket serves only"), body)
	}
	// The gateway's own listener is unchanged.
	resp, b := call(t, http.MethodGet, e.URL+"/v1/pools", testKey, nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
}

// socketDir is a fresh directory with a short path: a Unix socket's path
// must fit in about 100 bytes, and t.TempDir's, under a test's long name,
// need not.
func socketDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "qs")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}
