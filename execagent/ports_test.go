package execagent

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// portTarget is a program behind a port: it echoes what it received, streams
// events one at a time (releasing each when the test says), and echoes
// WebSocket messages.
func portTarget(t *testing.T, release chan struct{}) (port int) {
	t.Helper()
	up := websocket.Upgrader{Subprotocols: []string{"echo.v1"}}
	mux := http.NewServeMux()
	mux.HandleFunc("/echo/", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Method", r.Method)
		w.Header().Set("X-Path", r.URL.EscapedPath())
		w.Header().Set("X-Query", r.URL.RawQuery)
		w.Header().Set("X-Host", r.Host)
		w.Header().Set("X-Auth", r.Header.Get("Authorization"))
		w.Header().Set("X-Gen", r.Header.Get(agentapi.HeaderGeneration))
		w.Header().Set("X-Custom", r.Header.Get("X-Custom"))
		w.WriteHeader(http.StatusTeapot)
		_, _ = w.Write(b)
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
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			mt, m, err := c.ReadMessage()
			if err != nil {
				return
			}
			if c.WriteMessage(mt, m) != nil {
				return
			}
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	port, err = strconv.Atoi(u.Port())
	require.NoError(t, err)
	return port
}

func (a *testAgent) portRequest(t *testing.T, method, path string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, a.url+path, body)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testToken)
	return req
}

func TestPorts_ProxiesHTTP(t *testing.T) {
	a := newTestAgent(t, nil)
	port := portTarget(t, nil)
	req := a.portRequest(t, http.MethodPost, fmt.Sprintf("/v1/ports/%d/echo/a%%2Fb?x=1&y=%%20", port), strings.NewReader("hello body"))
	req.Header.Set("X-Custom", "kept")
	req.Header.Set(agentapi.HeaderGeneration, "0")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusTeapot, resp.StatusCode, "the program's status passes through")
	assert.Equal(t, "hello body", string(b))
	assert.Equal(t, http.MethodPost, resp.Header.Get("X-Method"))
	assert.Equal(t, "/echo/a%2Fb", resp.Header.Get("X-Path"), "the path keeps its escaping")
	assert.Equal(t, "x=1&y=%20", resp.Header.Get("X-Query"))
	assert.Equal(t, "127.0.0.1:"+strconv.Itoa(port), resp.Header.Get("X-Host"))
	assert.Empty(t, resp.Header.Get("X-Auth"), "the agent's token is not forwarded")
	assert.Empty(t, resp.Header.Get("X-Gen"), "the lease generation is not forwarded")
	assert.Equal(t, "kept", resp.Header.Get("X-Custom"))
}

func TestPorts_BadInput(t *testing.T) {
	a := newTestAgent(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	tests := []struct {
		name   string
		path   string
		token  string
		status int
		code   string
		msg    string
	}{
		{name: "port 0", path: "/v1/ports/0/", token: testToken, status: 400, code: agentapi.CodeBadRequest, msg: "port"},
		{name: "port too large", path: "/v1/ports/65536/", token: testToken, status: 400, code: agentapi.CodeBadRequest, msg: "65536"},
		{name: "port not a number", path: "/v1/ports/http/", token: testToken, status: 400, code: agentapi.CodeBadRequest, msg: "http"},
		{name: "signed port", path: "/v1/ports/+80/", token: testToken, status: 400, code: agentapi.CodeBadRequest, msg: "+80"},
		{name: "nothing listening", path: fmt.Sprintf("/v1/ports/%d/x", closed), token: testToken, status: 502, code: agentapi.CodePortClosed,
			msg: fmt.Sprintf("nothing is listening on port %d in the sandbox", closed)},
		{name: "wrong token", path: fmt.Sprintf("/v1/ports/%d/x", closed), token: "wrong", status: 401, code: agentapi.CodeUnauthorized, msg: "token"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := a.portRequest(t, http.MethodGet, tc.path, nil)
			req.Header.Set("Authorization", "Bearer "+tc.token)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			assert.Equal(t, tc.status, resp.StatusCode, string(b))
			assert.Contains(t, string(b), `"code":"`+tc.code+`"`)
			assert.Contains(t, string(b), tc.msg)
		})
	}
}

func TestPorts_StreamsEventsAsTheyCome(t *testing.T) {
	a := newTestAgent(t, nil)
	release := make(chan struct{})
	port := portTarget(t, release)
	resp, err := http.DefaultClient.Do(a.portRequest(t, http.MethodGet, fmt.Sprintf("/v1/ports/%d/events", port), nil))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	br := bufio.NewReader(resp.Body)
	for i := range 3 {
		// Event i arrives while the program still holds the others back.
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprintf("data: %d\n", i), line)
		_, _ = br.ReadString('\n')
		release <- struct{}{}
	}
}

func TestPorts_WebSocketUpgrade(t *testing.T) {
	a := newTestAgent(t, nil)
	port := portTarget(t, nil)
	d := websocket.Dialer{Subprotocols: []string{"echo.v1"}, HandshakeTimeout: 10 * time.Second}
	h := http.Header{"Authorization": {"Bearer " + testToken}}
	c, resp, err := d.Dial("ws"+strings.TrimPrefix(a.url, "http")+fmt.Sprintf("/v1/ports/%d/ws", port), h)
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, "echo.v1", resp.Header.Get("Sec-WebSocket-Protocol"), "the subprotocol passes through")
	for _, m := range []string{"one", strings.Repeat("x", 100<<10)} {
		require.NoError(t, c.WriteMessage(websocket.TextMessage, []byte(m)))
		mt, got, err := c.ReadMessage()
		require.NoError(t, err)
		assert.Equal(t, websocket.TextMessage, mt)
		assert.Equal(t, m, string(got))
	}
}
