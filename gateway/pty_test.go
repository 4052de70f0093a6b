package gateway

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// ptyRig is a gateway over a fake manager whose lease "sb-pty" reaches a
// real exec agent.
type ptyRig struct {
	gw  *testGateway
	mgr *fakeManager
	ws  string // ws://gateway/v1/sandboxes/sb-pty
}

func startPTYRig(t *testing.T, mutate func(*Config)) *ptyRig {
	t.Helper()
	agent := startAgent(t)
	mgr := newFakeManager(agent.URL)
	mgr.addLease("sb-pty", testKey, agent.URL, 0)
	gw := startGateway(t, mgr, mutate)
	return &ptyRig{gw: gw, mgr: mgr, ws: "ws" + strings.TrimPrefix(gw.URL, "http") + "/v1/sandboxes/sb-pty"}
}

// readPTY reads output until it contains want, or until the exit and the
// close; it returns the output, the exit code (nil before the exit) and the
// close.
func readPTY(t *testing.T, c *websocket.Conn, want string) (string, *int, *websocket.CloseError) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(testDeadline)))
	var out strings.Builder
	var code *int
	for {
		typ, b, err := c.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			require.ErrorAs(t, err, &ce, "output so far %q", out.String())
			return out.String(), code, ce
		}
		if typ == websocket.TextMessage {
			var ctl agentapi.PTYControl
			require.NoError(t, json.Unmarshal(b, &ctl))
			code = ctl.ExitCode
			continue
		}
		out.Write(b)
		if want != "" && strings.Contains(out.String(), want) {
			return out.String(), code, nil
		}
	}
}

func TestPTY_Gateway_ShellThroughTheRelay(t *testing.T) {
	r := startPTYRig(t, nil)
	c, resp, err := dialWS(t, r.ws+"/pty?cols=90&rows=20", wsBearer(testKey), agentapi.PTYSubprotocol)
	require.NoError(t, err)
	assert.Equal(t, agentapi.PTYSubprotocol, resp.Header.Get("Sec-WebSocket-Protocol"))
	created := resp.Header.Get(agentapi.HeaderPTY)
	require.NotEmpty(t, created, "the 101 names the PTY it created")
	_, body := call(t, http.MethodGet, r.gw.URL+"/v1/sandboxes/sb-pty/ptys/"+created, testKey, nil)
	assert.Equal(t, created, decode[agentapi.PTYInfo](t, body).ID)
	require.NoError(t, c.WriteMessage(websocket.BinaryMessage, []byte("stty size\n")))
	readPTY(t, c, "20 90")
	b, _ := json.Marshal(agentapi.PTYControl{Type: agentapi.PTYControlResize, Cols: 101, Rows: 33})
	require.NoError(t, c.WriteMessage(websocket.TextMessage, b))
	require.NoError(t, c.WriteMessage(websocket.BinaryMessage, []byte("stty size; exit 3\n")))
	out, code, ce := readPTY(t, c, "")
	assert.Contains(t, out, "33 101")
	require.NotNil(t, code, "the exit message")
	assert.Equal(t, 3, *code)
	require.NotNil(t, ce)
	assert.Equal(t, websocket.CloseNormalClosure, ce.Code)
}

func TestPTY_Gateway_RESTFallbackAndReattach(t *testing.T) {
	r := startPTYRig(t, nil)
	base := r.gw.URL + "/v1/sandboxes/sb-pty/ptys"
	resp, body := call(t, http.MethodPost, base, testKey, strings.NewReader(`{"command": ["bash", "--norc"], "cols": 70, "rows": 10}`))
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	info := decode[agentapi.PTYInfo](t, body)
	assert.Equal(t, 70, info.Cols)

	resp, body = call(t, http.MethodGet, base, testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Len(t, decode[agentapi.PTYList](t, body).PTYs, 1)

	resp, body = call(t, http.MethodPost, base+"/"+info.ID+"/resize", testKey, strings.NewReader(`{"cols": 77, "rows": 11}`))
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)

	// A browser: the key in the subprotocol list, which is never selected.
	auth := WSAuthProtocolPrefix + base64.RawURLEncoding.EncodeToString([]byte(testKey))
	c, resp2, err := dialWS(t, r.ws+"/pty?pty="+info.ID, nil, agentapi.PTYSubprotocol, auth)
	require.NoError(t, err)
	assert.Equal(t, agentapi.PTYSubprotocol, resp2.Header.Get("Sec-WebSocket-Protocol"))
	require.NoError(t, c.WriteMessage(websocket.BinaryMessage, []byte("stty size; echo mark-$((6*7))\n")))
	readPTY(t, c, "mark-42")
	require.NoError(t, c.Close())

	// A second attach gets the recent screen from the replay ring.
	c2, _, err := dialWS(t, r.ws+"/pty?pty="+info.ID, wsBearer(testKey), agentapi.PTYSubprotocol)
	require.NoError(t, err)
	out, _, _ := readPTY(t, c2, "mark-42")
	assert.Contains(t, out, "11 77")

	resp, body = call(t, http.MethodGet, base+"/"+info.ID, testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, agentapi.PTYRunning, decode[agentapi.PTYInfo](t, body).State)
	resp, body = call(t, http.MethodDelete, base+"/"+info.ID, testKey, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	assert.Equal(t, agentapi.PTYExited, decode[agentapi.PTYInfo](t, body).State)
	_, _, ce := readPTY(t, c2, "")
	require.NotNil(t, ce)
	assert.Equal(t, websocket.CloseNormalClosure, ce.Code, "the hang-up ends the attached socket")
}

func TestPTY_Gateway_Refusals(t *testing.T) {
	r := startPTYRig(t, func(c *Config) { c.WSLeaseCheck = 100 * time.Millisecond })
	t.Run("unknown pty closes 4404", func(t *testing.T) {
		c, _, err := dialWS(t, r.ws+"/pty?pty=pty-none", wsBearer(testKey), agentapi.PTYSubprotocol)
		require.NoError(t, err)
		_, _, ce := readPTY(t, c, "")
		assert.Equal(t, 4404, ce.Code)
		assert.Equal(t, agentapi.CodeNotFound, ce.Text)
	})
	t.Run("another key's sandbox is 404", func(t *testing.T) {
		_, resp, err := dialWS(t, r.ws+"/pty", wsBearer(otherKey))
		require.Error(t, err)
		assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	})
	t.Run("bad size is 400", func(t *testing.T) {
		_, resp, err := dialWS(t, r.ws+"/pty?cols=0", wsBearer(testKey))
		require.Error(t, err)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	})
	t.Run("oversized input closes 1009", func(t *testing.T) {
		c, _, err := dialWS(t, r.ws+"/pty", wsBearer(testKey))
		require.NoError(t, err)
		require.NoError(t, c.WriteMessage(websocket.BinaryMessage, make([]byte, agentapi.MaxPTYMessage+1)))
		_, _, ce := readPTY(t, c, "")
		assert.Equal(t, websocket.CloseMessageTooBig, ce.Code)
	})
	t.Run("released while open closes 4410", func(t *testing.T) {
		c, _, err := dialWS(t, r.ws+"/pty", wsBearer(testKey))
		require.NoError(t, err)
		require.NoError(t, c.WriteMessage(websocket.BinaryMessage, []byte("echo up-$((1+1))\n")))
		readPTY(t, c, "up-2")
		resp, _ := call(t, http.MethodDelete, r.gw.URL+"/v1/sandboxes/sb-pty", testKey, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		start := time.Now()
		_, _, ce := readPTY(t, c, "never")
		assert.Equal(t, WSCloseLeaseGone, ce.Code)
		assert.Equal(t, WSReasonLeaseGone, ce.Text)
		assert.Less(t, time.Since(start), 2*time.Second)
	})
	t.Run("released at connect time closes 4410", func(t *testing.T) {
		c, _, err := dialWS(t, r.ws+"/pty", wsBearer(testKey))
		require.NoError(t, err)
		_, _, ce := readPTY(t, c, "")
		assert.Equal(t, WSCloseLeaseGone, ce.Code)
	})
}
