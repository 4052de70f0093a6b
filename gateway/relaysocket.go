package gateway

import (
	"errors"
	"net"
	"net/http"
	"syscall"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/parkconn"
)

// relayListener marks the connections of the relay socket (ServeRelay).
type relayListener struct{ net.Listener }

func (l relayListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return relayConn{c}, nil
}

// relayConn is a connection accepted on the relay socket.
type relayConn struct{ net.Conn }

// SyscallConn exposes the socket, so that a waiting relay call still
// notices its agent leaving (peerClosed).
func (c relayConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.New("relay socket connection without a file descriptor")
	}
	return sc.SyscallConn()
}

// isRelayConn reports whether conn was accepted on the relay socket.
func isRelayConn(conn net.Conn) bool {
	if ic := parkconn.AsIdleConn(conn); ic != nil {
		conn = ic.Conn
	}
	_, ok := conn.(relayConn)
	return ok
}

// errRelaySocketOnly answers a path other than the relay's sandbox routes on
// the relay socket.
var errRelaySocketOnly = errclass.New(http.StatusNotFound, agentapi.CodeNotFound,
	"the relay socket serves only the model relay's sandbox routes (/v1/sandboxes/{id}/model/v1/...)")

// onlyRelay refuses, on the relay socket, every path but the relay's
// sandbox routes.
func (g *Gateway) onlyRelay(c *fiber.Ctx) error {
	if isRelayConn(c.Context().Conn()) && !agentapi.IsRelayPath(c.Path()) {
		return errRelaySocketOnly
	}
	return nil
}
