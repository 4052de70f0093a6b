package gateway

import (
	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/internal/errclass"
)

// relayPortWS relays a WebSocket upgrade of a port call (not yet: wsrelay).
func (g *Gateway) relayPortWS(c *fiber.Ctx, pc portCall) error {
	return errclass.New(fiber.StatusNotImplemented, "not_implemented", "WebSocket to sandbox ports: not yet")
}

// relayTCP relays a WebSocket to a TCP forward of a port (not yet).
func (g *Gateway) relayTCP(c *fiber.Ctx, pc portCall) error {
	return errclass.New(fiber.StatusNotImplemented, "not_implemented", "WebSocket TCP forward: not yet")
}
