package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/gofiber/fiber/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/warmpool"
)

// The WebSocket relay (docs/ARCHITECTURE.md "Terminals, ports and the
// console"): the one relay the PTY and port routes share. A route fences the
// call (API key, lease owner, active lease) and hands relayWS a wsTarget;
// relayWS dials the agent with the lease's token and generation, upgrades
// the client and pumps messages both ways until either side closes.

// WebSocket close codes of the relay: an error after the upgrade closes with
// WSCloseStatusBase + the HTTP status the same request would have had, and
// the error's code as the reason (a released lease: 4410 lease_gone).
const (
	WSCloseStatusBase = 4000
	WSCloseLeaseGone  = WSCloseStatusBase + http.StatusGone
	// WSReasonLeaseGone is the close reason of WSCloseLeaseGone.
	WSReasonLeaseGone = "lease_gone"
)

// WSAuthProtocolPrefix starts the subprotocol that carries a browser's API
// key: "quarry.auth." + base64url(key) (no padding). A browser cannot set
// headers on a WebSocket; the key never travels in a query string. The
// relay never selects it and never passes it to the agent.
const WSAuthProtocolPrefix = "quarry.auth."

// DefaultWSMaxMessage bounds one relayed message in either direction unless
// a route says otherwise (wsTarget.MaxMessage); a larger one closes the
// socket with 1009.
const DefaultWSMaxMessage = 64 << 10

// Timing of the relay's sockets.
const (
	// wsWriteTimeout bounds writing one message or control frame to a side.
	wsWriteTimeout = 10 * time.Second
	// wsCloseGrace is how long a side has to answer a close before its
	// connection is cut.
	wsCloseGrace = 2 * time.Second
	// wsBufferSize is the read and write buffer of each side's connection.
	wsBufferSize = 4 << 10
)

// wsTarget is the agent end of one relayed WebSocket, decided by the route.
type wsTarget struct {
	// ID is the sandbox id.
	ID string
	// Path returns the agent path and query for the caller's active lease,
	// e.g. "/v1/ptys/p1/attach". It may call the agent first (the PTY route
	// creates a PTY); its error closes the client as an agent's refusal
	// would (wsCloseOf). Required.
	Path func(ctx context.Context, lease warmpool.Lease) (string, error)
	// Protocols are the subprotocols offered to the agent, in preference
	// order; the client is answered with the agent's choice when the client
	// offered it. Nil passes the client's own offer through (without the
	// quarry.auth. protocol).
	Protocols []string
	// MaxMessage bounds one message in each direction (0:
	// DefaultWSMaxMessage).
	MaxMessage int64
	// Header holds more request headers for the agent (the port routes:
	// the page's cookies and headers); the relay's own (Authorization, the
	// generation, the handshake's) replace any of the same name.
	Header http.Header

	// Set by relayWS: the caller's owner id and the lease the request was
	// fenced with (the lease check compares its generation).
	owner string
	lease warmpool.Lease
	path  string
}

// wsSockets bounds and tracks the gateway's relayed WebSockets: at most
// QUARRY_MAX_WEBSOCKETS open at once (a refusal is a metric and a log line),
// each one's goroutines owned and waited for by closeAll. Safe for
// concurrent use.
type wsSockets struct {
	slots   chan struct{}
	dialer  *websocket.Dialer
	wg      sync.WaitGroup
	mu      sync.Mutex
	open    map[*wsSession]struct{}
	closing bool

	opened  prometheus.Gauge
	refused prometheus.Counter
	closed  *prometheus.CounterVec
	logged  logLimit

	// beforeClose, when set (tests), runs after a side's close frame is
	// decided and before it is written: a fault point.
	beforeClose atomic.Pointer[func()]
}

func newWSSockets(cfg Config) *wsSockets {
	d := &net.Dialer{Timeout: cfg.AgentDialTimeout}
	return &wsSockets{
		slots: make(chan struct{}, cfg.MaxWebSockets),
		dialer: &websocket.Dialer{
			NetDialContext:   d.DialContext,
			HandshakeTimeout: cfg.AgentDialTimeout,
			ReadBufferSize:   wsBufferSize,
			WriteBufferSize:  wsBufferSize,
		},
		open: make(map[*wsSession]struct{}),
		opened: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "quarry_gateway_websockets",
			Help: "WebSockets the gateway relays to agents now (PTY and port routes).",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quarry_gateway_websockets_refused_total",
			Help: "WebSocket requests refused with 503 because QUARRY_MAX_WEBSOCKETS were open.",
		}),
		closed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quarry_gateway_websockets_closed_total",
			Help: "Relayed WebSockets closed, by the close code of the client's side (sent to it, or its own; 1006: cut).",
		}, []string{"code"}),
	}
}

func (s *wsSockets) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.opened, s.refused, s.closed}
}

// acquire takes a slot; false when QUARRY_MAX_WEBSOCKETS are open or the
// gateway is shutting down.
func (s *wsSockets) acquire() bool {
	s.mu.Lock()
	closing := s.closing
	s.mu.Unlock()
	if closing {
		return false
	}
	select {
	case s.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

func (s *wsSockets) release() { <-s.slots }

// add records a started session; false when closeAll has begun (the
// session must end at once).
func (s *wsSockets) add(ss *wsSession) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.open[ss] = struct{}{}
	s.wg.Add(1)
	s.opened.Inc()
	return true
}

func (s *wsSockets) remove(ss *wsSession) {
	s.mu.Lock()
	delete(s.open, ss)
	s.mu.Unlock()
	s.opened.Dec()
	s.wg.Done()
}

// closeAll asks every open socket to close with 1001 (going away) and
// waits, until ctx ends, for their goroutines to finish. New sockets are
// refused from then on. It never touches a session's connections itself: a
// session may end on its own meanwhile, and once its handler returns,
// fasthttp takes the hijacked connection back.
func (s *wsSockets) closeAll(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	all := make([]*wsSession, 0, len(s.open))
	for ss := range s.open {
		all = append(all, ss)
	}
	s.mu.Unlock()
	for _, ss := range all {
		ss.stop()
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// offeredProtocols returns the client's subprotocols without the quarry.auth.
// one.
func offeredProtocols(h *fasthttp.RequestHeader) []string {
	var out []string
	for _, p := range bytes.Split(h.Peek(fiber.HeaderSecWebSocketProtocol), []byte(",")) {
		p = bytes.TrimSpace(p)
		if len(p) > 0 && !bytes.HasPrefix(p, []byte(WSAuthProtocolPrefix)) {
			out = append(out, string(p))
		}
	}
	return out
}

// wsClose is a close frame to send: its code and reason.
type wsClose struct {
	code   int
	reason string
}

// wsCloseOf turns an error (classified by errclass) into the close that
// ends a socket: 4000 + its status, its code as the reason; a lease that has
// ended is 4410 lease_gone.
func wsCloseOf(err error) wsClose {
	cl := errclass.Of(err)
	if cl.Status == http.StatusGone {
		return wsClose{WSCloseLeaseGone, WSReasonLeaseGone}
	}
	return wsClose{WSCloseStatusBase + cl.Status, cl.Code}
}

// relayWS relays the client's WebSocket request c to the agent of sandbox
// t.ID, fenced like every sandbox route: one lease read (owned by the
// caller, else 404). Before the upgrade it answers HTTP errors: 404 for
// another owner's or an unknown sandbox, then (for a request that is no
// WebSocket upgrade: 410 for an ended lease and) 426,
// 503 (Retry-After) when QUARRY_MAX_WEBSOCKETS are open. A lease that has
// ended (4410 lease_gone), a failed t.Path, an agent that refuses or cannot
// be reached are answered after the upgrade with a close (wsCloseOf), which
// browsers can read where they cannot read an HTTP status. The relay then
// runs on the hijacked connection until either side closes; every goroutine
// it starts ends with it.
func (g *Gateway) relayWS(c *fiber.Ctx, t wsTarget) error {
	upgrade := websocket.FastHTTPIsWebSocketUpgrade(c.Context())
	t.owner = ownerOf(c)
	var first *wsClose // set: close the client with it right after the upgrade
	lease, err := g.activeLease(c, t.ID)
	if err != nil {
		if cl := errclass.Of(err); cl.Status != http.StatusGone || !upgrade {
			return err
		}
		first = &wsClose{WSCloseLeaseGone, WSReasonLeaseGone}
	}
	if !upgrade {
		return errclass.New(http.StatusUpgradeRequired, agentapi.CodeBadRequest,
			"this route upgrades to a WebSocket: send GET with Connection: Upgrade and Upgrade: websocket")
	}
	t.lease = lease
	if !g.ws.acquire() {
		g.ws.refused.Inc()
		if g.ws.logged.allow(time.Now()) {
			g.log.Warn("websocket refused: QUARRY_MAX_WEBSOCKETS are open (or the gateway is shutting down)",
				"limit", cap(g.ws.slots), "sandbox", t.ID)
		}
		return &errclass.Error{Class: errclass.Class{Code: agentapi.CodeUnavailable, Status: http.StatusServiceUnavailable,
			Retryable: true, Message: "too many open WebSockets on this gateway (QUARRY_MAX_WEBSOCKETS); retry later"}}
	}
	if t.MaxMessage <= 0 {
		t.MaxMessage = DefaultWSMaxMessage
	}
	offered := offeredProtocols(&c.Request().Header)
	if t.Protocols == nil {
		t.Protocols = offered
	}

	var agent *websocket.Conn
	if first == nil {
		if t.path, err = t.Path(c.UserContext(), lease); err == nil {
			var sa sandboxAgent
			if sa, err = g.agentOf(t.ID, lease); err == nil {
				agent, err = sa.dialWS(c.UserContext(), t.path, t.Header, t.Protocols, t.MaxMessage)
			}
		}
		if err != nil {
			cl := wsCloseOf(errclass.Sandbox(t.ID, err))
			first = &cl
		}
	}
	// The client is answered with the agent's choice when it offered it
	// (without an agent: the first of the route's protocols it offered).
	want := t.Protocols
	if agent != nil {
		want = []string{agent.Subprotocol()}
	}
	selected := ""
	for _, p := range want {
		if p != "" && contains(offered, p) {
			selected = p
			break
		}
	}
	up := websocket.FastHTTPUpgrader{
		HandshakeTimeout: g.cfg.AgentDialTimeout,
		ReadBufferSize:   wsBufferSize,
		WriteBufferSize:  wsBufferSize,
		Subprotocols:     []string{},
	}
	if selected != "" {
		up.Subprotocols = []string{selected}
	}
	// The hijack handler runs once the 101 is written; if it never runs
	// (the client left), started stays false and the timer frees the slot
	// and the agent's connection.
	var started atomic.Bool
	abandon := time.AfterFunc(g.cfg.AgentDialTimeout+wsCloseGrace, func() {
		if started.CompareAndSwap(false, true) {
			if agent != nil {
				_ = agent.Close()
			}
			g.ws.release()
		}
	})
	err = up.Upgrade(c.Context(), func(client *websocket.Conn) {
		if !started.CompareAndSwap(false, true) {
			return
		}
		abandon.Stop()
		defer g.ws.release()
		if first != nil {
			closeWS(client, *first)
			g.ws.closed.WithLabelValues(strconv.Itoa(first.code)).Inc()
			return
		}
		ss := &wsSession{g: g, t: t, client: client, agent: agent,
			done: make(chan struct{}), stopping: make(chan struct{}), pumped: make(chan struct{})}
		ss.run()
	})
	if err != nil {
		// The upgrader answered the client's bad handshake itself.
		if started.CompareAndSwap(false, true) {
			abandon.Stop()
			if agent != nil {
				_ = agent.Close()
			}
			g.ws.release()
		}
		return nil
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// closeWS sends cl to conn, waits up to wsCloseGrace for the peer's close
// and closes the connection.
func closeWS(conn *websocket.Conn, cl wsClose) {
	_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(cl.code, cl.reason), time.Now().Add(wsWriteTimeout))
	_ = conn.SetReadDeadline(time.Now().Add(wsCloseGrace))
	for {
		if _, _, err := conn.NextReader(); err != nil {
			break
		}
	}
	_ = conn.Close()
}

// wsSession is one relayed socket: the client's and the agent's
// connections, two pumps and a watcher (pings, the lease check, a stop
// asked by closeAll), all ended when either side closes. Only these three
// goroutines touch the connections, and they end before run returns: the
// client's is fasthttp's hijacked connection, which it releases (and hands
// to another request) as soon as the hijack handler returns.
type wsSession struct {
	g             *Gateway
	t             wsTarget
	client, agent *websocket.Conn

	done     chan struct{} // closed when the first pump ends
	doneOnce sync.Once
	stopping chan struct{} // closed by stop: watch closes both sides
	stopOnce sync.Once
	pumped   chan struct{} // closed when both pumps have ended
	sentMu   sync.Mutex
	sent     *wsClose // the close sent to the client, once
	// agentClosed: a close was sent to the agent.
	agentClosed atomic.Bool
}

// run relays until either side closes, then closes both connections. Its
// goroutines end before it returns.
func (s *wsSession) run() {
	if !s.g.ws.add(s) {
		closeWS(s.client, wsClose{websocket.CloseGoingAway, "the gateway is shutting down"})
		closeWS(s.agent, wsClose{websocket.CloseGoingAway, "the gateway is shutting down"})
		return
	}
	defer s.g.ws.remove(s)
	s.client.SetReadLimit(s.t.MaxMessage)
	for _, c := range []*websocket.Conn{s.client, s.agent} {
		c.SetPongHandler(func(string) error { s.extendRead(c); return nil })
	}
	var pumps sync.WaitGroup
	pumps.Add(1)
	go func() { defer pumps.Done(); s.pump(s.client, s.agent, true) }()
	watched := make(chan struct{})
	go func() { defer close(watched); s.watch() }()
	s.pump(s.agent, s.client, false) // on the hijacked connection's goroutine
	pumps.Wait()
	close(s.pumped)
	<-watched
	_ = s.client.Close()
	_ = s.agent.Close()
	code := websocket.CloseAbnormalClosure
	s.sentMu.Lock()
	if s.sent != nil {
		code = s.sent.code
	}
	s.sentMu.Unlock()
	s.g.ws.closed.WithLabelValues(strconv.Itoa(code)).Inc()
}

// pump copies messages from src to dst one at a time (each bounded by the
// read limit, streamed through a small buffer), until src fails or closes;
// then it passes the close on to dst (fromClient says which way it runs)
// and ends the session.
func (s *wsSession) pump(src, dst *websocket.Conn, fromClient bool) {
	buf := make([]byte, wsBufferSize)
	for {
		s.extendRead(src)
		typ, r, err := src.NextReader()
		if err != nil {
			s.ended(err, fromClient)
			return
		}
		_ = dst.SetWriteDeadline(time.Now().Add(wsWriteTimeout))
		w, err := dst.NextWriter(typ)
		if err == nil {
			_, err = io.CopyBuffer(w, r, buf)
			if errors.Is(err, websocket.ErrReadLimit) {
				// Not finished as a message: dst gets the close in the
				// middle of it, never a truncated message it could answer.
				s.ended(err, fromClient)
				return
			}
			if cerr := w.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			if errors.Is(err, websocket.ErrReadLimit) {
				s.ended(err, fromClient)
			} else {
				s.ended(err, !fromClient) // dst failed: as if dst had closed
			}
			return
		}
	}
}

// extendRead gives conn two ping intervals for its next message or pong,
// unless the session is ending (then its close grace stands).
func (s *wsSession) extendRead(conn *websocket.Conn) {
	select {
	case <-s.done:
	default:
		_ = conn.SetReadDeadline(time.Now().Add(2 * s.g.cfg.WSPingInterval))
	}
}

// ended handles the end of one direction: err is what reading from the
// side (fromClient: the client) returned. The other side is told how it
// ended; the first end starts the session's close.
func (s *wsSession) ended(err error, fromClient bool) {
	var cl wsClose
	var ce *websocket.CloseError
	switch {
	case errors.As(err, &ce):
		cl = wsClose{ce.Code, ce.Text}
		switch ce.Code {
		case websocket.CloseNoStatusReceived:
			cl = wsClose{websocket.CloseNormalClosure, ""}
		case websocket.CloseAbnormalClosure, websocket.CloseTLSHandshake:
			cl = wsClose{websocket.CloseGoingAway, "the other side went away"}
		}
	case errors.Is(err, websocket.ErrReadLimit):
		// The library told the sender 1009 already.
		cl = wsClose{websocket.CloseMessageTooBig, "message over " + strconv.FormatInt(s.t.MaxMessage, 10) + " bytes"}
	default:
		cl = wsClose{websocket.CloseGoingAway, "the other side went away"}
		if !fromClient {
			cl = wsClose{WSCloseStatusBase + http.StatusBadGateway, agentapi.CodeAgentUnreachable}
		}
	}
	if fromClient {
		s.closeSide(s.agent, cl, false)
		s.recordClient(cl) // how the client's side ended, for the metric
	} else {
		s.closeSide(s.client, cl, true)
	}
	s.finish()
}

// recordClient records the first close of the client's side (sent to it,
// or its own); false when one was recorded already.
func (s *wsSession) recordClient(cl wsClose) bool {
	s.sentMu.Lock()
	defer s.sentMu.Unlock()
	if s.sent != nil {
		return false
	}
	s.sent = &cl
	return true
}

// closeSide sends cl to conn, once a side: the first close decided
// wins (two close frames would break the protocol).
func (s *wsSession) closeSide(conn *websocket.Conn, cl wsClose, client bool) {
	if client && !s.recordClient(cl) {
		return
	}
	if !client && !s.agentClosed.CompareAndSwap(false, true) {
		return
	}
	if len(cl.reason) > 123 {
		cl.reason = cl.reason[:123]
	}
	if h := s.g.ws.beforeClose.Load(); h != nil {
		(*h)()
	}
	_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(cl.code, cl.reason), time.Now().Add(wsWriteTimeout))
}

// finish starts the session's end: both sides have wsCloseGrace to answer
// their close, then their reads fail and the pumps end (watch cuts both
// connections if they have not ended by then).
func (s *wsSession) finish() {
	s.doneOnce.Do(func() {
		close(s.done)
		dl := time.Now().Add(wsCloseGrace)
		_ = s.client.SetReadDeadline(dl)
		_ = s.agent.SetReadDeadline(dl)
	})
}

// stop asks the session to close both sides with 1001 (the gateway is
// shutting down); watch does it. It returns at once, and does nothing to a
// session that has ended.
func (s *wsSession) stop() {
	s.stopOnce.Do(func() { close(s.stopping) })
}

// closeBoth closes the client with cl and the agent with 1001 (the relay,
// not the agent's program, decided to end), e.g. when the lease ended.
func (s *wsSession) closeBoth(code int, reason string) {
	s.closeSide(s.client, wsClose{code, reason}, true)
	s.closeSide(s.agent, wsClose{websocket.CloseGoingAway, reason}, false)
	s.finish()
}

// watch pings both sides every QUARRY_WS_PING_INTERVAL and reads the lease
// every QUARRY_WS_LEASE_CHECK: released, expired, lost, or a new generation
// closes the socket with 4410 lease_gone; stop closes it with 1001. Once the
// session ends, it cuts both connections if the pumps have not ended within
// wsCloseGrace, however they stand.
func (s *wsSession) watch() {
	ping := time.NewTicker(s.g.cfg.WSPingInterval)
	defer ping.Stop()
	check := time.NewTicker(s.g.cfg.WSLeaseCheck)
	defer check.Stop()
	for {
		select {
		case <-s.done:
			cut := time.NewTimer(wsCloseGrace)
			defer cut.Stop()
			select {
			case <-s.pumped:
			case <-cut.C:
				_ = s.client.NetConn().Close()
				_ = s.agent.NetConn().Close()
			}
			return
		case <-s.stopping:
			s.closeBoth(websocket.CloseGoingAway, "the gateway is shutting down")
		case <-ping.C:
			dl := time.Now().Add(wsWriteTimeout)
			_ = s.client.WriteControl(websocket.PingMessage, nil, dl)
			_ = s.agent.WriteControl(websocket.PingMessage, nil, dl)
		case <-check.C:
			if !s.g.stillHeld(context.Background(), s.t.ID, s.t.owner, s.t.lease.Generation) {
				s.closeBoth(WSCloseLeaseGone, WSReasonLeaseGone)
			}
		}
	}
}
