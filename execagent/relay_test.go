package execagent

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// relayUpstream serves on a Unix socket in a fresh directory as the
// gateway's relay socket does, and records the requests it gets.
func relayUpstream(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	path := filepath.Join(socketDir(t), "relay.sock")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return path
}

func TestRelay_ForwardsRelayRoutesToTheSocketUnauthenticated(t *testing.T) {
	var seen []string
	sock := relayUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		seen = append(seen, r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get("Authorization")+" "+string(body))
		if strings.HasSuffix(r.URL.Path, "/chat/completions") {
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 3 {
				fmt.Fprintf(w, "data: chunk %d\n\n", i)
				w.(http.Flusher).Flush()
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"data":[{"id":"policy"}]}`)
	})
	a := newTestAgent(t, func(c *Config) { c.RelaySocket = sock })

	req, err := http.NewRequest(http.MethodGet, a.url+"/v1/sandboxes/sbx-1/model/v1/models?x=1", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer qrt-relay-token")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "no agent token needed: %s", body)
	assert.JSONEq(t, `{"data":[{"id":"policy"}]}`, string(body))

	resp, err = http.Post(a.url+"/v1/sandboxes/sbx-1/model/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	sc := bufio.NewScanner(resp.Body)
	var lines []string
	for sc.Scan() {
		if sc.Text() != "" {
			lines = append(lines, sc.Text())
		}
	}
	assert.Equal(t, []string{"data: chunk 0", "data: chunk 1", "data: chunk 2"}, lines)
	assert.Equal(t, []string{
		"GET /v1/sandboxes/sbx-1/model/v1/models?x=1 Bearer qrt-relay-token ",
		`POST /v1/sandboxes/sbx-1/model/v1/chat/completions  {"stream":true}`,
	}, seen, "paths, queries, the relay token and bodies pass unchanged")
}

func TestRelay_OtherPathsNeedTheAgentToken(t *testing.T) {
	sock := relayUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("forwarded %s", r.URL.Path)
	})
	a := newTestAgent(t, func(c *Config) { c.RelaySocket = sock })
	for _, p := range []string{"/v1/sandboxes/sbx-1/model/transcript", "/v1/sandboxes/sbx-1/exec", "/v1/sandboxes/"} {
		resp, err := http.Get(a.url + p)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, p)
	}
}

func TestRelay_NoSocketNoRoute(t *testing.T) {
	a := newTestAgent(t, nil)
	resp, err := http.Get(a.url + "/v1/sandboxes/sbx-1/model/v1/models")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "an agent without a relay socket serves no relay")
}

func TestRelay_GatewayDownIs502(t *testing.T) {
	a := newTestAgent(t, func(c *Config) { c.RelaySocket = filepath.Join(socketDir(t), "relay.sock") })
	resp, err := http.Get(a.url + "/v1/sandboxes/sbx-1/model/v1/models")
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	e := apiError(t, agentapi.CheckResponse(resp))
	assert.Equal(t, agentapi.CodeAgentUnreachable, e.Code)
	assert.Contains(t, e.Message, "model relay is unreachable")
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
