package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/warmpool"
)

// portEcho is a program behind a sandbox port: /echo/ answers what it got
// (as JSON), /events streams one event per release, /status/N answers N.
func portEcho(t *testing.T, release chan struct{}) int {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/echo/", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Set-Cookie", "app=1; Path=/")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"method": r.Method, "path": r.URL.EscapedPath(), "query": r.URL.RawQuery, "body": string(b),
			"headers": r.Header, "host": r.Host,
		})
	})
	mux.HandleFunc("/events", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
	})
	mux.HandleFunc("/status/401", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "the app's own 401", http.StatusUnauthorized)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	_, p, _ := net.SplitHostPort(u.Host)
	var port int
	fmt.Sscan(p, &port)
	return port
}

type echoed struct {
	Method  string              `json:"method"`
	Path    string              `json:"path"`
	Query   string              `json:"query"`
	Body    string              `json:"body"`
	Host    string              `json:"host"`
	Headers map[string][]string `json:"headers"`
}

// portSetup is a gateway over a real agent with one lease, and a program
// on a port.
type portSetup struct {
	gw    *testGateway
	mgr   *fakeManager
	lease warmpool.Lease
	port  int
	rel   chan struct{}
}

func newPortSetup(t *testing.T) *portSetup {
	ag := startAgent(t)
	mgr := newFakeManager(ag.URL)
	gw := startGateway(t, mgr, nil)
	rel := make(chan struct{})
	return &portSetup{gw: gw, mgr: mgr, lease: mgr.addLease(warmpool.NewLeaseID(), testKey, ag.URL, 0), port: portEcho(t, rel), rel: rel}
}

func (s *portSetup) url(path string) string {
	return fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d%s", s.gw.URL, s.lease.ID, s.port, path)
}

func TestPorts_ProxiesHTTPAndStripsQuarryHeaders(t *testing.T) {
	s := newPortSetup(t)
	resp, b := call(t, http.MethodPut, s.url("/echo/a%2Fb?x=1&quarry_preview=&y=2"), testKey, strings.NewReader("the body"),
		"X-App", "kept", "Cookie", "app=1", "Connection", "X-Hop", "X-Hop", "dropped")
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	var e echoed
	require.NoError(t, json.Unmarshal(b, &e))
	assert.Equal(t, http.MethodPut, e.Method)
	assert.Equal(t, "/echo/a%2Fb", e.Path)
	assert.Equal(t, "x=1&y=2", e.Query, "the preview parameter is Quarry's")
	assert.Equal(t, "the body", e.Body)
	assert.Equal(t, fmt.Sprintf("127.0.0.1:%d", s.port), e.Host)
	assert.Equal(t, []string{"kept"}, e.Headers["X-App"])
	assert.Equal(t, []string{"app=1"}, e.Headers["Cookie"], "the page's cookies pass")
	for _, h := range []string{"Authorization", "X-Hop", agentapi.HeaderGeneration} {
		assert.NotContains(t, e.Headers, h)
	}
	assert.Empty(t, resp.Header.Get(agentapi.HeaderPortProxied))
	assert.Equal(t, "app=1; Path=/", resp.Header.Get("Set-Cookie"), "the program's headers pass")

	// HEAD and OPTIONS pass as any other method.
	for _, m := range []string{http.MethodHead, http.MethodOptions, http.MethodPatch, http.MethodDelete} {
		resp, b := call(t, m, s.url("/echo/m"), testKey, nil)
		assert.Equal(t, http.StatusOK, resp.StatusCode, m)
		if m == http.MethodHead {
			assert.Empty(t, b)
		} else {
			assert.Contains(t, string(b), `"method":"`+m+`"`)
		}
	}

	// The program's own 401 is its answer, not the agent's.
	resp, b = call(t, http.MethodGet, s.url("/status/401"), testKey, nil)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.Contains(t, string(b), "the app's own 401")
}

func TestPorts_BadInput(t *testing.T) {
	s := newPortSetup(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	base := s.gw.URL + "/v1/sandboxes/" + s.lease.ID + "/ports/"
	tests := []struct {
		name   string
		url    string
		key    string
		status int
		code   string
		msg    string
	}{
		{name: "port 0", url: base + "0/", key: testKey, status: 400, code: "bad_request", msg: "port"},
		{name: "port 65536", url: base + "65536/x", key: testKey, status: 400, code: "bad_request", msg: "65536"},
		{name: "port not a number", url: base + "http/x", key: testKey, status: 400, code: "bad_request", msg: "http"},
		{name: "nothing listening", url: fmt.Sprintf("%s%d/x", base, closed), key: testKey, status: 502, code: agentapi.CodePortClosed,
			msg: fmt.Sprintf("nothing is listening on port %d in the sandbox", closed)},
		{name: "no key", url: base + "80/", status: 401, code: "unauthorized", msg: "API key"},
		{name: "another owner", url: base + "80/", key: otherKey, status: 404, code: "not_found", msg: s.lease.ID},
		{name: "forged preview", url: base + "80/?quarry_preview=e30.AAAA", status: 401, code: "unauthorized", msg: "signature"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := call(t, http.MethodGet, tc.url, tc.key, nil)
			assert.Equal(t, tc.status, resp.StatusCode, string(b))
			d := decodeError(t, b)
			assert.Equal(t, tc.code, d.Code)
			assert.Contains(t, d.Message, tc.msg)
		})
	}
}

func TestPorts_EventsFlowAsTheyCome(t *testing.T) {
	s := newPortSetup(t)
	resp := openStream(t, http.MethodGet, s.url("/events"), nil, "Authorization", "Bearer "+testKey)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	br := bufio.NewReader(resp.Body)
	for i := range 3 {
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprintf("data: %d\n", i), line, "event %d arrives before the program sends the next", i)
		_, _ = br.ReadString('\n')
		s.rel <- struct{}{}
	}
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	assert.Empty(t, string(rest), "nothing is added to the program's stream")
}

func TestPorts_PreviewURL(t *testing.T) {
	s := newPortSetup(t)
	resp, b := callJSON(t, http.MethodPost, s.gw.URL+"/v1/sandboxes/"+s.lease.ID+fmt.Sprintf("/ports/%d/url", s.port), testKey, map[string]any{"ttl_seconds": 60})
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	var ans previewAnswer
	require.NoError(t, json.Unmarshal(b, &ans))
	assert.WithinDuration(t, time.Now().Add(time.Minute), ans.ExpiresAt, 2*time.Second)
	u, err := url.Parse(ans.URL)
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprintf("/v1/sandboxes/%s/ports/%d/", s.lease.ID, s.port), u.Path)

	// Without the API key: the token in the query, then its cookie.
	echo := strings.Replace(ans.URL, "/?", "/echo/x?a=1&", 1)
	resp, b = call(t, http.MethodGet, echo, "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	var e echoed
	require.NoError(t, json.Unmarshal(b, &e))
	assert.Equal(t, "a=1", e.Query)
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "quarry_preview" {
			cookie = c
		}
	}
	require.NotNil(t, cookie, "the first request sets the preview cookie")
	assert.True(t, cookie.HttpOnly)
	assert.Equal(t, http.SameSiteStrictMode, cookie.SameSite)
	assert.Equal(t, u.Path, cookie.Path)
	resp, b = call(t, http.MethodGet, s.url("/echo/y"), "", nil, "Cookie", "quarry_preview="+cookie.Value, "Authorization", "Basic YXBwOnB3")
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	require.NoError(t, json.Unmarshal(b, &e))
	assert.Equal(t, "/echo/y", e.Path)
	assert.NotContains(t, e.Headers, "Authorization", "no caller's Authorization reaches the program")
	assert.NotContains(t, e.Headers, "Cookie")

	tests := []struct {
		name  string
		ttl   any
		code  int
		field string
	}{
		{name: "ttl over the max", ttl: 24*3600 + 1, code: 400, field: "ttl_seconds"},
		{name: "negative ttl", ttl: -1, code: 400, field: "ttl_seconds"},
		{name: "ttl a string", ttl: "60", code: 400, field: "ttl_seconds"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := callJSON(t, http.MethodPost, s.gw.URL+"/v1/sandboxes/"+s.lease.ID+fmt.Sprintf("/ports/%d/url", s.port), testKey, map[string]any{"ttl_seconds": tc.ttl})
			assert.Equal(t, tc.code, resp.StatusCode, string(b))
			assert.Contains(t, string(b), tc.field)
		})
	}

	// A new generation of the lease (the sandbox went to another lease):
	// the URL no longer works.
	l := s.lease
	l.Generation++
	s.mgr.put(l)
	resp, b = call(t, http.MethodGet, echo, "", nil)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.Contains(t, decodeError(t, b).Message, "earlier lease")

	// Released: 401 naming the lease's end.
	l.State, l.Reason, l.EndedAt = warmpool.LeaseReleased, "released", time.Now()
	s.mgr.put(l)
	resp, b = call(t, http.MethodGet, echo, "", nil)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.Contains(t, decodeError(t, b).Message, "has ended")
}
