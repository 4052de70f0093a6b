package gateway

import (
	"context"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/warmpool"
)

// maxPTYSize bounds the cols and rows of a PTY (the agent's bound).
const maxPTYSize = 1000

// ptyWebSocket handles GET /v1/sandboxes/{id}/pty: a WebSocket
// (agentapi.PTYSubprotocol) relayed to the agent's PTY attach. ?pty=<id>
// attaches to an existing PTY; without it the gateway first creates one from
// ?cols=&rows=&cwd= (the sandbox's shell). The REST routes
// /v1/sandboxes/{id}/ptys… are proxied to the agent as they are (routeTable).
func (g *Gateway) ptyWebSocket(c *fiber.Ctx) error {
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	q := c.Context().QueryArgs()
	ptyID := string(q.Peek("pty"))
	var create agentapi.PTYCreateRequest
	if ptyID != "" {
		if err := checkID(ptyID); err != nil {
			return badinput.New("pty", "%s", err.Error())
		}
	} else {
		cols, err := queryInt(q, "cols", 0, 1, maxPTYSize)
		if err != nil {
			return err
		}
		rows, err := queryInt(q, "rows", 0, 1, maxPTYSize)
		if err != nil {
			return err
		}
		create.Cols, create.Rows, create.Cwd = int(cols), int(rows), string(q.Peek("cwd"))
	}
	return g.relayWS(c, wsTarget{
		ID:         id,
		Protocols:  []string{agentapi.PTYSubprotocol},
		MaxMessage: agentapi.MaxPTYMessage,
		Path: func(ctx context.Context, lease warmpool.Lease) (string, error) {
			if ptyID != "" {
				c.Set(agentapi.HeaderPTY, ptyID)
				return agentapi.PTYPath(ptyID, "/attach"), nil
			}
			agent, err := g.agentOf(id, lease)
			if err != nil {
				return "", err
			}
			ctx, cancel := context.WithTimeout(ctx, g.cfg.RequestTimeout)
			defer cancel()
			var info agentapi.PTYInfo
			if err := agent.call(ctx, agentapi.RoutePTYs, create, &info); err != nil {
				return "", err
			}
			c.Set(agentapi.HeaderPTY, info.ID) // on the 101: the client can reattach to it
			return agentapi.PTYPath(info.ID, "/attach"), nil
		},
	})
}
