package gateway

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/internal/errclass"
)

// The port routes' own WebSocket relay. gateway/wsrelay.go (the PTY
// routes') is meant to serve both; until they are joined this one relays
// the port proxy's and ROCK's /portforward sockets.

// maxPortSockets bounds the port WebSockets a gateway relays at once; past
// it an upgrade is refused (503) with a log line naming the limit.
const maxPortSockets = 4096

// wsBuf is the size of each relayed socket's read and write buffers.
const wsBuf = 16 << 10

// wsCloseWait bounds the write of a close message.
const wsCloseWait = time.Second

// portSockets tracks the relayed sockets so that Shutdown can close them
// and wait for their pumps. Safe for concurrent use.
type portSockets struct {
	mu     sync.Mutex
	open   map[*websocket.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
	logged logLimit
}

func newPortSockets() *portSockets {
	return &portSockets{open: make(map[*websocket.Conn]struct{})}
}

// add reserves a place for a socket pair; false when at the limit or
// shutting down.
func (s *portSockets) add() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(s.open) >= maxPortSockets {
		return false
	}
	s.wg.Add(1)
	return true
}

func (s *portSockets) track(c *websocket.Conn, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !on {
		delete(s.open, c)
		return
	}
	if s.closed {
		_ = c.Close()
		return
	}
	s.open[c] = struct{}{}
}

// closeAll closes every relayed socket (going away, 1001) and waits for
// their pumps until ctx is done.
func (s *portSockets) closeAll(ctx context.Context) {
	s.mu.Lock()
	s.closed = true
	for c := range s.open {
		_ = c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseGoingAway, "the gateway is shutting down"), time.Now().Add(wsCloseWait))
		_ = c.Close()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// relayPortWS relays a WebSocket upgrade of a port call to the agent's
// port proxy, the client's subprotocols passed to the program and the
// program's choice back.
func (g *Gateway) relayPortWS(c *fiber.Ctx, pc portCall) error {
	return g.relayWS(c, pc, agentPortURI(pc, c.Request().URI().QueryString()))
}

// relayTCP relays ROCK's /portforward WebSocket to the agent's TCP forward.
func (g *Gateway) relayTCP(c *fiber.Ctx, pc portCall) error {
	if !websocket.FastHTTPIsWebSocketUpgrade(c.Context()) {
		return badinput.New("upgrade", "/portforward is a WebSocket: send a WebSocket upgrade")
	}
	return g.relayWS(c, pc, agentapi.PortForwardPathPrefix+strconv.Itoa(pc.port))
}

// relayWS dials the agent's WebSocket at uri (path and query) first, so
// that its refusal (nothing listening: 502; a stale generation: 410) is the
// client's HTTP answer, then upgrades the client and pumps messages both
// ways until either side closes, passing the close code on.
func (g *Gateway) relayWS(c *fiber.Ctx, pc portCall, uri string) error {
	ac, err := g.agents.get(pc.lease.AgentURL)
	if err != nil {
		return errclass.Sandbox(pc.id, err)
	}
	if !g.ws.add() {
		if g.ws.logged.allow(time.Now()) {
			g.log.Warn("port websockets: refused an upgrade at the limit", "limit", maxPortSockets)
		}
		return errclass.New(fiber.StatusServiceUnavailable, "unavailable", "too many WebSockets through this gateway (at most "+strconv.Itoa(maxPortSockets)+"); retry later")
	}
	started := false
	defer func() {
		if !started {
			g.ws.wg.Done()
		}
	}()
	hdr := http.Header{}
	var protos []string
	var hb fasthttp.RequestHeader
	copyPortHeaders(&c.Request().Header, &hb, pc)
	hb.VisitAll(func(k, v []byte) {
		switch key := http.CanonicalHeaderKey(string(k)); {
		case strings.HasPrefix(key, "Sec-Websocket-"):
			if key == "Sec-Websocket-Protocol" {
				for _, p := range strings.Split(string(v), ",") {
					if p = strings.TrimSpace(p); p != "" {
						protos = append(protos, p)
					}
				}
			}
		default:
			hdr.Add(key, string(v))
		}
	})
	hdr.Set(fiber.HeaderAuthorization, "Bearer "+pc.lease.AgentToken)
	hdr.Set(agentapi.HeaderGeneration, strconv.FormatInt(pc.lease.Generation, 10))
	idle := g.cfg.IdleTimeout
	d := websocket.Dialer{
		NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			nc, err := (&net.Dialer{Timeout: g.cfg.AgentDialTimeout}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return newIdleConn(nc, idle), nil
		},
		HandshakeTimeout: g.cfg.RequestTimeout,
		ReadBufferSize:   wsBuf,
		WriteBufferSize:  wsBuf,
		Subprotocols:     protos,
	}
	wsURL := "ws" + strings.TrimPrefix(ac.base, "http") + uri
	agent, resp, err := d.DialContext(c.UserContext(), wsURL, hdr)
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return g.agentRefusedWS(c, pc, resp)
		}
		return g.agentFailed(c, pc.id, pc.lease, err)
	}
	var sel []string
	if p := agent.Subprotocol(); p != "" {
		sel = []string{p}
	}
	up := websocket.FastHTTPUpgrader{
		ReadBufferSize: wsBuf, WriteBufferSize: wsBuf, Subprotocols: sel,
		// The caller is authenticated by its API key or preview token (the
		// cookie is SameSite=Strict): any origin may connect.
		CheckOrigin: func(*fasthttp.RequestCtx) bool { return true },
	}
	err = up.Upgrade(c.Context(), func(client *websocket.Conn) {
		defer g.ws.wg.Done()
		g.ws.track(client, true)
		g.ws.track(agent, true)
		defer g.ws.track(client, false)
		defer g.ws.track(agent, false)
		pumpWS(client, agent)
	})
	if err != nil {
		_ = agent.Close()
		return nil // the upgrader answered the client
	}
	started = true
	return nil
}

// agentRefusedWS answers the client with the agent's refusal of the
// WebSocket dial: a stale generation or a refused token as forward maps
// them, anything else (400, 502 port_closed) as the agent said.
func (g *Gateway) agentRefusedWS(c *fiber.Ctx, pc portCall, resp *http.Response) error {
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxAgentErrorBody))
	fr := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(fr)
	fr.SetStatusCode(resp.StatusCode)
	fr.SetBody(b)
	if s := resp.StatusCode; s == http.StatusConflict || s == http.StatusUnauthorized {
		if err := g.inspectAgentError(fr, pc.lease, s); err != nil {
			return errclass.Sandbox(pc.id, err)
		}
	}
	c.Status(resp.StatusCode)
	c.Set(fiber.HeaderContentType, resp.Header.Get("Content-Type"))
	return c.Send(b)
}

// pumpWS copies messages both ways until either side ends, then closes
// both, passing a close code and reason on.
func pumpWS(a, b *websocket.Conn) {
	a.SetReadLimit(agentapi.MaxPortMessage)
	b.SetReadLimit(agentapi.MaxPortMessage)
	done := make(chan struct{})
	go func() {
		defer close(done)
		copyWS(b, a)
	}()
	copyWS(a, b)
	<-done
}

// copyWS copies the messages of src to dst, streamed (a message is never
// held whole), until src ends; it then sends dst src's close (or 1011 for
// a broken connection) and closes both.
func copyWS(dst, src *websocket.Conn) {
	defer func() { _ = src.Close(); _ = dst.Close() }()
	for {
		mt, r, err := src.NextReader()
		if err != nil {
			code, text := websocket.CloseInternalServerErr, "the other side's connection broke"
			var ce *websocket.CloseError
			switch {
			case errors.As(err, &ce):
				code, text = ce.Code, ce.Text
				if code == websocket.CloseNoStatusReceived || code == websocket.CloseAbnormalClosure {
					code = websocket.CloseNormalClosure
				}
			case errors.Is(err, websocket.ErrReadLimit):
				code, text = websocket.CloseMessageTooBig, "message larger than "+strconv.Itoa(agentapi.MaxPortMessage)+" bytes"
				_ = src.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), time.Now().Add(wsCloseWait))
			}
			_ = dst.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), time.Now().Add(wsCloseWait))
			return
		}
		w, err := dst.NextWriter(mt)
		if err != nil {
			return
		}
		if _, err := io.Copy(w, r); err != nil {
			_ = w.Close()
			return
		}
		if w.Close() != nil {
			return
		}
	}
}
