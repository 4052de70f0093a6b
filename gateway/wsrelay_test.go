package gateway

import (
	"context"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/gofiber/fiber/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/warmpool"
)

// wsAgent is the agent end of the relay tests: a net/http WebSocket server
// that records the handshake it got and echoes each message. A message
// "close <code> <text>" makes it close with that code. Paths /refuse/<status>
// answer that HTTP error in the agent's shape.
type wsAgent struct {
	URL string

	mu        sync.Mutex
	headers   []http.Header
	closes    []websocket.CloseError // the close frames it received
	pings     atomic.Int64
	conns     atomic.Int64 // open connections
	closedAll chan struct{}
}

func startWSAgent(t *testing.T) *wsAgent {
	t.Helper()
	a := &wsAgent{}
	up := websocket.Upgrader{Subprotocols: []string{"chat"}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.headers = append(a.headers, r.Header.Clone())
		a.mu.Unlock()
		if code, ok := strings.CutPrefix(r.URL.Path, "/refuse/"); ok {
			status := map[string]int{"404": 404, "409": 409}[code]
			errCode := map[string]string{"404": agentapi.CodeNotFound, "409": agentapi.CodeStaleGeneration}[code]
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write([]byte(`{"error":{"code":"` + errCode + `","message":"refused"}}`))
			return
		}
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		a.conns.Add(1)
		defer a.conns.Add(-1)
		defer c.Close()
		c.SetPingHandler(func(s string) error {
			a.pings.Add(1)
			return c.WriteControl(websocket.PongMessage, []byte(s), time.Now().Add(time.Second))
		})
		c.SetReadLimit(1 << 20) // the relay, not the agent, enforces the limit under test
		for {
			typ, msg, err := c.ReadMessage()
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				a.mu.Lock()
				a.closes = append(a.closes, *ce)
				a.mu.Unlock()
				return
			}
			if err != nil {
				return
			}
			if rest, ok := strings.CutPrefix(string(msg), "close "); ok {
				code, text, _ := strings.Cut(rest, " ")
				n := 0
				for _, ch := range code {
					n = n*10 + int(ch-'0')
				}
				_ = c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(n, text), time.Now().Add(time.Second))
				_, _, _ = c.ReadMessage() // the relay's answer
				return
			}
			if err := c.WriteMessage(typ, msg); err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	a.URL = srv.URL
	return a
}

func (a *wsAgent) lastHeader() http.Header {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.headers) == 0 {
		return nil
	}
	return a.headers[len(a.headers)-1]
}

func (a *wsAgent) received() []websocket.CloseError {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]websocket.CloseError(nil), a.closes...)
}

// relayRig is a gateway over a fake manager whose lease "sb-1" reaches a
// wsAgent, with one test route GET /ws/:id?path=... relayed by relayWS (the
// PTY and port routes are relayWS's real callers; this one keeps the relay's
// tests apart from them).
type relayRig struct {
	g     *testGateway
	mgr   *fakeManager
	agent *wsAgent
	url   string // ws://.../ws/sb-1
}

func startRelayRig(t *testing.T, mutate func(*Config)) *relayRig {
	t.Helper()
	agent := startWSAgent(t)
	mgr := newFakeManager(agent.URL)
	mgr.addLease("sb-1", testKey, agent.URL, 7)
	g := startGateway(t, mgr, mutate)
	app := fiber.New(fiber.Config{DisableStartupMessage: true, ErrorHandler: g.errorHandler})
	app.Get("/ws/:id", g.authenticateWS, func(c *fiber.Ctx) error {
		path := c.Query("path", "/echo")
		return g.relayWS(c, wsTarget{ID: c.Params("id"),
			Path: func(context.Context, warmpool.Lease) (string, error) { return path, nil }})
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = app.Listener(ln) }()
	t.Cleanup(func() { _ = app.ShutdownWithTimeout(testDeadline) })
	return &relayRig{g: g, mgr: mgr, agent: agent, url: "ws://" + ln.Addr().String() + "/ws/sb-1"}
}

func wsBearer(key string) http.Header {
	return http.Header{"Authorization": {"Bearer " + key}}
}

func dialWS(t *testing.T, url string, h http.Header, protocols ...string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	d := websocket.Dialer{HandshakeTimeout: testDeadline, Subprotocols: protocols}
	c, resp, err := d.Dial(url, h)
	if c != nil {
		t.Cleanup(func() { _ = c.Close() })
	}
	return c, resp, err
}

// readClose reads until the close frame and returns it.
func readClose(t *testing.T, c *websocket.Conn, within time.Duration) *websocket.CloseError {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(within)))
	for {
		_, _, err := c.ReadMessage()
		if err == nil {
			continue
		}
		var ce *websocket.CloseError
		require.ErrorAs(t, err, &ce, "want a close frame")
		return ce
	}
}

func TestRelayWS_RelaysBothWaysWithTheLeaseCredentials(t *testing.T) {
	r := startRelayRig(t, nil)
	c, resp, err := dialWS(t, r.url, wsBearer(testKey))
	require.NoError(t, err)
	assert.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)

	for _, m := range []struct {
		typ  int
		data string
	}{{websocket.TextMessage, "hello"}, {websocket.BinaryMessage, "\x00\x01\xff"}, {websocket.TextMessage, strings.Repeat("x", 60<<10)}} {
		require.NoError(t, c.WriteMessage(m.typ, []byte(m.data)))
		typ, got, err := c.ReadMessage()
		require.NoError(t, err)
		assert.Equal(t, m.typ, typ)
		assert.Equal(t, m.data, string(got))
	}
	h := r.agent.lastHeader()
	require.NotNil(t, h)
	assert.Equal(t, "Bearer "+agentToken, h.Get("Authorization"), "the agent gets the lease's token, not the API key")
	assert.Equal(t, "7", h.Get(agentapi.HeaderGeneration))
	assert.Equal(t, 1.0, testutil.ToFloat64(r.g.ws.opened))
	require.NoError(t, c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second)))
	eventually(t, func() bool { return testutil.ToFloat64(r.g.ws.opened) == 0 && r.agent.conns.Load() == 0 }, "the session and the agent's connection end")
	eventually(t, func() bool { return len(r.g.ws.slots) == 0 }, "the slot is released")
}

func TestRelayWS_Auth(t *testing.T) {
	r := startRelayRig(t, nil)
	b64 := func(k string) string { return WSAuthProtocolPrefix + base64.RawURLEncoding.EncodeToString([]byte(k)) }
	tests := []struct {
		name       string
		header     http.Header
		protocols  []string
		wantStatus int
	}{
		{name: "header", header: wsBearer(testKey), wantStatus: http.StatusSwitchingProtocols},
		{name: "subprotocol", protocols: []string{"chat", b64(testKey)}, wantStatus: http.StatusSwitchingProtocols},
		{name: "missing", wantStatus: http.StatusUnauthorized},
		{name: "wrong header", header: wsBearer("wrong-key-0123456789"), wantStatus: http.StatusUnauthorized},
		{name: "wrong subprotocol", protocols: []string{b64("wrong-key-0123456789")}, wantStatus: http.StatusUnauthorized},
		{name: "malformed subprotocol", protocols: []string{WSAuthProtocolPrefix + "!!"}, wantStatus: http.StatusUnauthorized},
		{name: "query is not a key", wantStatus: http.StatusUnauthorized},
		{name: "another owner's sandbox", header: wsBearer(otherKey), wantStatus: http.StatusNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			url := r.url
			if tc.name == "query is not a key" {
				url += "?api_key=" + testKey
			}
			c, resp, err := dialWS(t, url, tc.header, tc.protocols...)
			require.NotNil(t, resp)
			assert.Equal(t, tc.wantStatus, resp.StatusCode)
			if tc.wantStatus != http.StatusSwitchingProtocols {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			if len(tc.protocols) > 0 {
				assert.Equal(t, "chat", c.Subprotocol(), "the agent's choice among the client's offer")
				assert.Equal(t, []string{"chat"}, websocket.Subprotocols(&http.Request{Header: r.agent.lastHeader()}),
					"the auth protocol never reaches the agent")
			}
		})
	}
}

func TestRelayWS_OversizedClientMessageCloses1009(t *testing.T) {
	r := startRelayRig(t, nil)
	c, _, err := dialWS(t, r.url, wsBearer(testKey))
	require.NoError(t, err)
	require.NoError(t, c.WriteMessage(websocket.BinaryMessage, make([]byte, DefaultWSMaxMessage+1)))
	ce := readClose(t, c, testDeadline)
	assert.Equal(t, websocket.CloseMessageTooBig, ce.Code)
	eventually(t, func() bool { return len(r.agent.received()) == 1 }, "the agent is told")
	assert.Equal(t, websocket.CloseMessageTooBig, r.agent.received()[0].Code)
}

func TestRelayWS_CloseCodesPassBothWays(t *testing.T) {
	r := startRelayRig(t, nil)
	t.Run("agent to client", func(t *testing.T) {
		c, _, err := dialWS(t, r.url, wsBearer(testKey))
		require.NoError(t, err)
		require.NoError(t, c.WriteMessage(websocket.TextMessage, []byte("close 4321 bye now")))
		ce := readClose(t, c, testDeadline)
		assert.Equal(t, 4321, ce.Code)
		assert.Equal(t, "bye now", ce.Text)
	})
	t.Run("client to agent", func(t *testing.T) {
		c, _, err := dialWS(t, r.url, wsBearer(testKey))
		require.NoError(t, err)
		n := len(r.agent.received())
		require.NoError(t, c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(4322, "done"), time.Now().Add(time.Second)))
		eventually(t, func() bool { return len(r.agent.received()) > n }, "the agent gets the close")
		got := r.agent.received()[n]
		assert.Equal(t, 4322, got.Code)
		assert.Equal(t, "done", got.Text)
	})
	eventually(t, func() bool { return testutil.ToFloat64(r.g.ws.opened) == 0 && r.agent.conns.Load() == 0 }, "every session ended")
}

func TestRelayWS_ErrorsAfterTheUpgradeAreCloseCodes(t *testing.T) {
	r := startRelayRig(t, nil)
	tests := []struct {
		name       string
		path       string
		prepare    func()
		wantCode   int
		wantReason string
	}{
		{name: "agent 404", path: "/refuse/404", wantCode: 4404, wantReason: agentapi.CodeNotFound},
		{name: "stale generation", path: "/refuse/409", wantCode: WSCloseLeaseGone, wantReason: WSReasonLeaseGone},
		{name: "released at connect time", path: "/echo", prepare: func() {
			_, err := r.mgr.Release(context.Background(), "sb-1", OwnerOf(testKey))
			require.NoError(t, err)
		}, wantCode: WSCloseLeaseGone, wantReason: WSReasonLeaseGone},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.prepare != nil {
				tc.prepare()
			}
			c, _, err := dialWS(t, r.url+"?path="+tc.path, wsBearer(testKey))
			require.NoError(t, err)
			ce := readClose(t, c, testDeadline)
			assert.Equal(t, tc.wantCode, ce.Code)
			assert.Equal(t, tc.wantReason, ce.Text)
		})
	}
	eventually(t, func() bool { return len(r.g.ws.slots) == 0 }, "every slot released")
}

// A lease that ends while its socket is open closes the socket with 4410
// at the first lease check that sees it ended. The test counts the checks
// instead of timing them (a loaded machine delays a ticker, not the rule):
// how soon that is, is QUARRY_WS_LEASE_CHECK's to say.
func TestRelayWS_ReleasedWhileOpenCloses4410(t *testing.T) {
	r := startRelayRig(t, func(c *Config) { c.WSLeaseCheck = 20 * time.Millisecond })
	var sawEnded atomic.Int32 // lease reads that returned the lease ended
	r.mgr.GetFn = func(_ context.Context, id, owner string) (warmpool.Lease, error) {
		r.mgr.mu.Lock()
		defer r.mgr.mu.Unlock()
		l, err := r.mgr.ownLease(id, owner)
		if err == nil && l.State != warmpool.LeaseActive {
			sawEnded.Add(1)
		}
		return l, err
	}
	c, _, err := dialWS(t, r.url, wsBearer(testKey))
	require.NoError(t, err)
	require.NoError(t, c.WriteMessage(websocket.TextMessage, []byte("ping")))
	_, _, err = c.ReadMessage()
	require.NoError(t, err)
	_, err = r.mgr.Release(context.Background(), "sb-1", OwnerOf(testKey))
	require.NoError(t, err)
	ce := readClose(t, c, testDeadline)
	assert.Equal(t, WSCloseLeaseGone, ce.Code)
	assert.Equal(t, WSReasonLeaseGone, ce.Text)
	eventually(t, func() bool { return r.agent.conns.Load() == 0 }, "the agent's side is closed too")
	assert.Equal(t, int32(1), sawEnded.Load(), "the first lease check that saw the release closed the socket, and no check ran after")
}

func TestRelayWS_MaxWebSocketsRefuses503(t *testing.T) {
	r := startRelayRig(t, func(c *Config) { c.MaxWebSockets = 1 })
	c, _, err := dialWS(t, r.url, wsBearer(testKey))
	require.NoError(t, err)
	_, resp, err := dialWS(t, r.url, wsBearer(testKey))
	require.Error(t, err)
	require.NotNil(t, resp)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))
	assert.Equal(t, 1.0, testutil.ToFloat64(r.g.ws.refused))
	require.NoError(t, c.Close())
	eventually(t, func() bool { return len(r.g.ws.slots) == 0 }, "the slot comes back")
	_, _, err = dialWS(t, r.url, wsBearer(testKey))
	assert.NoError(t, err, "a slot is free again")
}

func TestRelayWS_NotAWebSocketIs426(t *testing.T) {
	r := startRelayRig(t, nil)
	resp, _ := call(t, http.MethodGet, "http"+strings.TrimPrefix(r.url, "ws"), testKey, nil)
	assert.Equal(t, http.StatusUpgradeRequired, resp.StatusCode)
}

func TestRelayWS_PingsBothSides(t *testing.T) {
	r := startRelayRig(t, func(c *Config) { c.WSPingInterval = 50 * time.Millisecond })
	c, _, err := dialWS(t, r.url, wsBearer(testKey))
	require.NoError(t, err)
	var clientPings atomic.Int64
	c.SetPingHandler(func(s string) error {
		clientPings.Add(1)
		return c.WriteControl(websocket.PongMessage, []byte(s), time.Now().Add(time.Second))
	})
	go func() {
		for {
			if _, _, err := c.ReadMessage(); err != nil {
				return
			}
		}
	}()
	eventually(t, func() bool { return clientPings.Load() >= 3 && r.agent.pings.Load() >= 3 }, "pings reach both sides")
	// Answering pongs keeps a quiet socket open well past two intervals.
	assert.Equal(t, 1.0, testutil.ToFloat64(r.g.ws.opened))
}

func TestRelayWS_SilentClientIsClosed(t *testing.T) {
	r := startRelayRig(t, func(c *Config) { c.WSPingInterval = 50 * time.Millisecond })
	c, _, err := dialWS(t, r.url, wsBearer(testKey))
	require.NoError(t, err)
	_ = c // never read: no pong goes back
	eventually(t, func() bool { return r.agent.conns.Load() == 0 && testutil.ToFloat64(r.g.ws.opened) == 0 },
		"a client that answers no ping is closed, and the agent's side with it")
}

func TestRelayWS_ShutdownClosesOpenSockets(t *testing.T) {
	r := startRelayRig(t, nil)
	c, _, err := dialWS(t, r.url, wsBearer(testKey))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	require.NoError(t, r.g.ws.closeAll(ctx))
	ce := readClose(t, c, testDeadline)
	assert.Equal(t, websocket.CloseGoingAway, ce.Code)
	assert.Equal(t, 0.0, testutil.ToFloat64(r.g.ws.opened))
}

// The memory of open relayed sockets, measured in one process that also
// holds their clients and the agent's ends: an upper bound of the gateway's
// share. It fails past 256 KiB a socket.
func TestRelayWS_MemoryPerSocket(t *testing.T) {
	const n = 200
	r := startRelayRig(t, func(c *Config) { c.MaxWebSockets = n })
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	goBefore := runtime.NumGoroutine()
	conns := make([]*websocket.Conn, 0, n)
	for range n {
		c, _, err := dialWS(t, r.url, wsBearer(testKey))
		require.NoError(t, err)
		require.NoError(t, c.WriteMessage(websocket.TextMessage, []byte("x")))
		_, _, err = c.ReadMessage()
		require.NoError(t, err)
		conns = append(conns, c)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perSocket := (int64(after.HeapInuse) + int64(after.StackInuse) - int64(before.HeapInuse) - int64(before.StackInuse)) / n
	goroutines := float64(runtime.NumGoroutine()-goBefore) / n
	t.Logf("%d sockets: %.1f KiB and %.1f goroutines per socket (gateway relay + test client + agent end)", n, float64(perSocket)/1024, goroutines)
	assert.Less(t, perSocket, int64(256<<10))
	for _, c := range conns {
		require.NoError(t, c.Close())
	}
	eventually(t, func() bool { return testutil.ToFloat64(r.g.ws.opened) == 0 }, "every session ends")
	eventually(t, func() bool { return runtime.NumGoroutine() <= goBefore+5 }, "their goroutines end")
}

// Shutdown asks a session to close, and after its close frame to the
// client is decided and before it is written, the session ends on its own
// (its client went away, the relay closes the agent's side) and its handler
// returns, handing the hijacked connection back to fasthttp. Nothing may
// write to that connection then: before the fix closeAll wrote the frame
// itself (under -race a data race, then a nil pointer panic in
// SetWriteDeadline: a gateway's SIGTERM).
func TestRelayWS_ShutdownWhileASessionEndsOnItsOwn(t *testing.T) {
	r := startRelayRig(t, nil)
	c, _, err := dialWS(t, r.url, wsBearer(testKey))
	require.NoError(t, err)
	require.NoError(t, c.WriteMessage(websocket.TextMessage, []byte("x")))
	_, _, err = c.ReadMessage()
	require.NoError(t, err)
	var first atomic.Bool
	agentEnded := make(chan bool, 1)
	hook := func() {
		if !first.CompareAndSwap(false, true) {
			return
		}
		_ = c.NetConn().Close() // the client goes away
		deadline := time.Now().Add(testDeadline)
		for r.agent.conns.Load() != 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		agentEnded <- r.agent.conns.Load() == 0
	}
	r.g.ws.beforeClose.Store(&hook)
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	require.NoError(t, r.g.ws.closeAll(ctx))
	require.True(t, first.Load(), "the fault point was reached")
	assert.True(t, <-agentEnded, "the agent's side ended while the shutdown's close waited")
	assert.Equal(t, 0.0, testutil.ToFloat64(r.g.ws.opened))
}
