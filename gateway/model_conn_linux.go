package gateway

import (
	"crypto/tls"
	"net"
	"syscall"

	"github.com/quarryhq/quarry/internal/parkconn"
	"golang.org/x/sys/unix"
)

// peerClosed reports whether the client of conn has closed its side: a
// non-blocking peek at the socket reads end of file (or a reset). Nothing
// is consumed; a connection that cannot be inspected counts as open.
func peerClosed(conn net.Conn) bool {
	if pc := parkconn.AsConn(conn); pc != nil {
		conn = pc.Conn
	}
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	if ic, ok := conn.(*parkconn.IdleConn); ok {
		conn = ic.Conn
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	_ = raw.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		closed = (n == 0 && err == nil) || err == unix.ECONNRESET
		return true
	})
	return closed
}
