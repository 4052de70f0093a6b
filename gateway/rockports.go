package gateway

import (
	"bytes"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/rockcompat"
)

// ROCK's ways of naming the target port of its proxy routes
// (rock/admin/entrypoints/sandbox_proxy_api.py): the path
// /sandboxes/{id}/proxy/port/{p}/..., this header, or this query parameter.
const (
	rockTargetPortHeader = "X-ROCK-Target-Port"
	rockTargetPortQuery  = "rock_target_port"
	// rockVNCPort is the port of ROCK's /sandboxes/{id}/vnc/... routes.
	rockVNCPort = 8006
)

// rockDropHeaders are the ROCK request headers that are Quarry's (the port
// selector, the ways rockAuth reads the API key), never forwarded.
var rockDropHeaders = []string{rockTargetPortHeader, "XRL-Authorization", "X-Key", "X-API-Key"}

// rockPortRoutes are ROCK's proxy routes, served by the port proxy behind
// rockAuth: /sandboxes/{id}/proxy/... and /sandboxes/{id}/vnc/... under
// every method, and the WebSocket TCP forward /sandboxes/{id}/portforward.
func (g *Gateway) rockPortRoutes() []rockcompat.Route {
	rts := make([]rockcompat.Route, 0, 2*len(portMethods)+1)
	for _, m := range portMethods {
		rts = append(rts,
			rockcompat.Route{Method: m, Path: rockcompat.Prefix + "/sandboxes/:id/proxy/*", Handler: g.rockProxy},
			rockcompat.Route{Method: m, Path: rockcompat.Prefix + "/sandboxes/:id/vnc/*", Handler: g.rockVNC})
	}
	return append(rts, rockcompat.Route{Method: fiber.MethodGet, Path: rockcompat.Prefix + "/sandboxes/:id/portforward", Handler: g.rockPortForward})
}

// isRockPortPath reports whether uri (without its query) is one of ROCK's
// proxy routes.
func isRockPortPath(uri []byte) bool {
	rest, ok := bytes.CutPrefix(uri, []byte(rockcompat.Prefix+"/sandboxes/"))
	if !ok {
		return false
	}
	i := bytes.IndexByte(rest, '/')
	return i > 0 && (bytes.HasPrefix(rest[i:], []byte("/proxy")) || bytes.HasPrefix(rest[i:], []byte("/vnc")))
}

// rockProxy handles ROCK's /sandboxes/{id}/proxy/{path}: the target port
// from exactly one of the path (port/{p}/...), X-ROCK-Target-Port or
// rock_target_port, as ROCK resolves it; two of them, or none (ROCK would
// reach its own rocklet), is 400.
func (g *Gateway) rockProxy(c *fiber.Ctx) error {
	port, rest, err := rockTargetPort(c.Params("*"), string(c.Request().Header.Peek(rockTargetPortHeader)),
		string(c.Context().QueryArgs().Peek(rockTargetPortQuery)))
	if err != nil {
		return err
	}
	return g.rockRelay(c, port, rest)
}

// rockVNC handles ROCK's /sandboxes/{id}/vnc/{path}: port 8006.
func (g *Gateway) rockVNC(c *fiber.Ctx) error {
	return g.rockRelay(c, rockVNCPort, "/"+c.Params("*"))
}

// rockRelay fences a ROCK port call (rockAuth stored the owner) and relays
// it as the port routes do.
func (g *Gateway) rockRelay(c *fiber.Ctx, port int, rest string) error {
	pc, err := g.rockPortCall(c, port)
	if err != nil {
		return err
	}
	pc.rest, pc.dropHeaders, pc.dropQuery = rest, rockDropHeaders, []string{rockTargetPortQuery}
	return g.relayPort(c, pc)
}

// rockPortCall reads the lease of a ROCK port route's sandbox (as the
// owner rockAuth stored) for a call to port.
func (g *Gateway) rockPortCall(c *fiber.Ctx, port int) (portCall, error) {
	id, err := pathID(c, "id")
	if err != nil {
		return portCall{}, err
	}
	lease, err := g.activeLease(c, id)
	return portCall{id: id, port: port, lease: lease}, err
}

// rockTargetPort resolves the target port of a ROCK proxy path (the part
// after /proxy/), header and query value, and returns the path behind the
// port (starting with "/").
func rockTargetPort(path, header, query string) (int, string, error) {
	var sources []string
	port, rest := 0, "/"+path
	if p, ok := strings.CutPrefix(path, "port/"); ok {
		num, tail, _ := strings.Cut(p, "/")
		n, err := portParam(num)
		if err != nil {
			return 0, "", err
		}
		port, rest = n, "/"+tail
		sources = append(sources, "path")
	}
	for _, s := range []struct{ name, v string }{{"header " + rockTargetPortHeader, header}, {"query parameter " + rockTargetPortQuery, query}} {
		if s.v == "" {
			continue
		}
		n, err := portParam(s.v)
		if err != nil {
			return 0, "", err
		}
		port = n
		sources = append(sources, s.name)
	}
	switch len(sources) {
	case 0:
		return 0, "", badinput.New("port", "name the sandbox port: /proxy/port/{port}/..., the %s header or the %s query parameter", rockTargetPortHeader, rockTargetPortQuery)
	case 1:
		return port, rest, nil
	}
	return 0, "", badinput.New("port", "cannot specify target port via multiple sources: %s", strings.Join(sources, ", "))
}

// rockPortForwardMin and the excluded port are ROCK's bounds of
// /portforward (rock/common/port_validation.py).
const (
	rockPortForwardMin = 1024
	rockPortForwardSSH = 22
)

// rockPortForward handles ROCK's GET /sandboxes/{id}/portforward?port=N: a
// WebSocket whose binary messages are the bytes of a TCP connection to
// port N in the sandbox.
func (g *Gateway) rockPortForward(c *fiber.Ctx) error {
	v := string(c.Context().QueryArgs().Peek("port"))
	port, err := portParam(v)
	if err != nil {
		return err
	}
	if port < rockPortForwardMin || port == rockPortForwardSSH {
		return badinput.New("port", "port %d is not allowed for port forwarding (ROCK forwards %d-65535)", port, rockPortForwardMin)
	}
	pc, err := g.rockPortCall(c, port)
	if err != nil {
		return err
	}
	return g.relayTCP(c, pc)
}
