package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/rockcompat"
)

// wsEcho is a WebSocket echo program on a port: it selects subprotocol
// echo.v1 when offered, first sends what its request carried, and closes
// with 4001 when asked.
func wsEcho(t *testing.T) int {
	t.Helper()
	up := websocket.Upgrader{Subprotocols: []string{"echo.v1"}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.WriteMessage(websocket.TextMessage, []byte("query="+r.URL.RawQuery+" cookie="+r.Header.Get("Cookie")+" auth="+r.Header.Get("Authorization")))
		for {
			mt, m, err := c.ReadMessage()
			if err != nil {
				return
			}
			if string(m) == "close-please" {
				_ = c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(4001, "asked to"))
				return
			}
			if c.WriteMessage(mt, m) != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().(*net.TCPAddr).Port
}

func wsURL(httpURL string) string { return "ws" + strings.TrimPrefix(httpURL, "http") }

func TestPortsWS_RelaysMessagesAndCloses(t *testing.T) {
	s := newPortSetup(t)
	port := wsEcho(t)
	d := websocket.Dialer{Subprotocols: []string{"other", "echo.v1"}, HandshakeTimeout: testDeadline}
	u := fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d/ws?a=1", wsURL(s.gw.URL), s.lease.ID, port)
	c, resp, err := d.Dial(u, http.Header{"Authorization": {"Bearer " + testKey}, "Cookie": {"app=1"}})
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, "echo.v1", resp.Header.Get("Sec-WebSocket-Protocol"), "the program's choice of subprotocol")
	_, first, err := c.ReadMessage()
	require.NoError(t, err)
	assert.Equal(t, "query=a=1 cookie=app=1 auth=", string(first), "the query and the page's cookies pass; the API key does not")
	for _, m := range []struct {
		mt   int
		data string
	}{{websocket.TextMessage, "hello"}, {websocket.BinaryMessage, strings.Repeat("\x00\xff", 300<<10)}} {
		require.NoError(t, c.WriteMessage(m.mt, []byte(m.data)))
		mt, got, err := c.ReadMessage()
		require.NoError(t, err)
		assert.Equal(t, m.mt, mt)
		assert.Equal(t, len(m.data), len(got))
		assert.Equal(t, m.data, string(got))
	}
	require.NoError(t, c.WriteMessage(websocket.TextMessage, []byte("close-please")))
	_, _, err = c.ReadMessage()
	var ce *websocket.CloseError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, 4001, ce.Code, "the program's close code passes on")
	assert.Equal(t, "asked to", ce.Text)
}

func TestPortsWS_Refusals(t *testing.T) {
	s := newPortSetup(t)
	port := wsEcho(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	d := websocket.Dialer{HandshakeTimeout: testDeadline}
	h := http.Header{"Authorization": {"Bearer " + testKey}}

	// Nothing listening: refused after the upgrade (browsers read a close
	// code, not a status), 4000 + 502.
	c, _, err := d.Dial(fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d/ws", wsURL(s.gw.URL), s.lease.ID, closed), h)
	require.NoError(t, err)
	_, _, err = c.ReadMessage()
	var ce *websocket.CloseError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, WSCloseStatusBase+http.StatusBadGateway, ce.Code)
	assert.Equal(t, agentapi.CodePortClosed, ce.Text)
	c.Close()

	// No key: the HTTP 401 before any upgrade.
	_, resp, err := d.Dial(fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d/ws", wsURL(s.gw.URL), s.lease.ID, port), nil)
	require.Error(t, err)
	require.NotNil(t, resp)
	b, _ := io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, string(b))
	assert.Contains(t, string(b), "API key")
}

func TestPortsWS_PreviewURL(t *testing.T) {
	s := newPortSetup(t)
	port := wsEcho(t)
	resp, b := callJSON(t, http.MethodPost, fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d/url", s.gw.URL, s.lease.ID, port), testKey, map[string]any{})
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	var ans previewAnswer
	require.NoError(t, json.Unmarshal(b, &ans))
	u := wsURL(strings.Replace(ans.URL, "/?", "/devtools?", 1))
	c, _, err := websocket.DefaultDialer.Dial(u, nil)
	require.NoError(t, err, "a preview URL opens a WebSocket without the API key")
	defer c.Close()
	_, first, err := c.ReadMessage()
	require.NoError(t, err)
	assert.Equal(t, "query= cookie= auth=", string(first), "the token is not forwarded")
	require.NoError(t, c.WriteMessage(websocket.TextMessage, []byte("via preview")))
	_, got, err := c.ReadMessage()
	require.NoError(t, err)
	assert.Equal(t, "via preview", string(got))
}

func TestRockPorts_PortForward(t *testing.T) {
	s := newPortSetup(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_, _ = io.Copy(conn, conn) // a TCP echo
			}()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	base := wsURL(s.gw.URL) + rockcompat.Prefix + "/sandboxes/" + s.lease.ID + "/portforward?port="
	c, _, err := websocket.DefaultDialer.Dial(base+fmt.Sprint(port), http.Header{"X-Key": {testKey}})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.WriteMessage(websocket.BinaryMessage, []byte("raw tcp bytes")))
	var got []byte
	require.NoError(t, c.SetReadDeadline(time.Now().Add(testDeadline)))
	for len(got) < len("raw tcp bytes") {
		_, m, err := c.ReadMessage()
		require.NoError(t, err)
		got = append(got, m...)
	}
	assert.Equal(t, "raw tcp bytes", string(got))

	for _, tc := range []struct {
		port   string
		status int
	}{{"22", 400}, {"80", 400}, {"x", 400}} {
		_, resp, err := websocket.DefaultDialer.Dial(base+tc.port, http.Header{"X-Key": {testKey}})
		require.Error(t, err)
		require.NotNil(t, resp, tc.port)
		assert.Equal(t, tc.status, resp.StatusCode, tc.port)
	}
}
