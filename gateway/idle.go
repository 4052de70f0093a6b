package gateway

import (
	"net"
	"time"

	"github.com/quarryhq/quarry/internal/parkconn"
)

// The server's connections (idle timeouts, parking, Shutdown's unserved
// connections) are package parkconn's; the gateway wires them in
// gateway.go (listener, park, observe, Shutdown). These names keep the
// gateway's other call sites as they were.

// idleConn is an agent or client connection whose waits are bounded.
type idleConn = parkconn.IdleConn

// newIdleConn wraps c (parkconn.NewIdleConn).
func newIdleConn(c net.Conn, idle time.Duration) *idleConn { return parkconn.NewIdleConn(c, idle) }

// lingerOnClose marks conn to linger when it is closed (parkconn.LingerOnClose).
func lingerOnClose(conn net.Conn) { parkconn.LingerOnClose(conn) }

// asIdleConn returns the *idleConn under conn, or nil (parkconn.AsIdleConn).
func asIdleConn(conn net.Conn) *idleConn { return parkconn.AsIdleConn(conn) }

// asParkConn returns the parked connection of conn, or nil (parkconn.AsConn).
func asParkConn(conn net.Conn) *parkconn.Conn { return parkconn.AsConn(conn) }
