package gateway

import (
	"context"
	"net/http"
	"strconv"
	"strings"

	"github.com/fasthttp/websocket"
	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/warmpool"
)

// relayPortWS relays a WebSocket upgrade of a port call through wsrelay to
// the agent's port proxy: the client's subprotocols are offered to the
// program and its choice answered, the page's headers and cookies pass as
// on HTTP (but Origin: Chromium's DevTools refuses foreign origins), and
// messages may be up to agentapi.MaxPortMessage (CDP's screenshots are
// megabytes). A refusal after the upgrade closes with 4000 + its status:
// nothing listening is 4502 port_closed.
func (g *Gateway) relayPortWS(c *fiber.Ctx, pc portCall) error {
	uri := agentPortURI(pc, c.Request().URI().QueryString())
	return g.relayWS(c, wsTarget{
		ID:         pc.id,
		Path:       func(context.Context, warmpool.Lease) (string, error) { return uri, nil },
		MaxMessage: agentapi.MaxPortMessage,
		Header:     portWSHeader(&c.Request().Header, pc),
	})
}

// portWSHeader is what of the client's WebSocket handshake goes on to the
// program: copyPortHeaders' choice without the handshake's own headers
// (the relay's dialer makes them) and Origin.
func portWSHeader(from *fasthttp.RequestHeader, pc portCall) http.Header {
	var hb fasthttp.RequestHeader
	copyPortHeaders(from, &hb, pc)
	h := http.Header{}
	hb.VisitAll(func(k, v []byte) {
		key := http.CanonicalHeaderKey(string(k))
		if strings.HasPrefix(key, "Sec-Websocket-") || key == "Origin" {
			return
		}
		h.Add(key, string(v))
	})
	return h
}

// relayTCP relays ROCK's /portforward WebSocket to the agent's TCP forward
// of pc.port.
func (g *Gateway) relayTCP(c *fiber.Ctx, pc portCall) error {
	if !websocket.FastHTTPIsWebSocketUpgrade(c.Context()) {
		return badinput.New("upgrade", "/portforward is a WebSocket: send a WebSocket upgrade")
	}
	uri := agentapi.PortForwardPathPrefix + strconv.Itoa(pc.port)
	return g.relayWS(c, wsTarget{
		ID:         pc.id,
		Path:       func(context.Context, warmpool.Lease) (string, error) { return uri, nil },
		MaxMessage: agentapi.MaxPortMessage,
	})
}
