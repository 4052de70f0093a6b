package parkconn

import (
	"crypto/tls"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// lingerTimeout bounds how long Close keeps reading what a client still
// sends after an early answer (see IdleConn.Close).
const lingerTimeout = time.Second

// IdleConn bounds every wait on a connection by an idle timeout: each Read
// and Write may block at most idle (or until an earlier deadline set with
// Set*Deadline). Streams that keep moving, however long, are not cut. The
// deadline is refreshed at most every idle/16, so the effective idle limit
// lies between 15/16 idle and idle. Read and Write may be called from
// different goroutines.
type IdleConn struct {
	net.Conn
	idle time.Duration
	rd   idleDeadline
	wd   idleDeadline

	linger atomic.Bool // Close lingers: the client may still be sending

	// Set by the idle listener: the set the conn leaves on Close, when it
	// was accepted, and whether a request of it reached the app.
	set      *Set
	accepted time.Time
	served   atomic.Bool
}

// NewIdleConn wraps c so that each of its waits lasts at most idle. Its
// Close does not linger until LingerOnClose.
func NewIdleConn(c net.Conn, idle time.Duration) *IdleConn {
	return &IdleConn{Conn: c, idle: idle}
}

// idleDeadline is one direction's deadline: the one set by the user of the
// conn (zero: none) and when the idle deadline was last applied.
type idleDeadline struct {
	mu       sync.Mutex
	explicit time.Time
	applied  time.Time
}

// apply sets, through set, the earlier of the explicit deadline and now+idle.
// With explicit it first records t as the explicit deadline; without, it
// does nothing when the deadline was applied less than idle/16 ago.
func (d *idleDeadline) apply(idle time.Duration, set func(time.Time) error, explicit bool, t time.Time) error {
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if explicit {
		d.explicit = t
	} else if now.Sub(d.applied) <= idle/16 {
		return nil
	}
	d.applied = now
	dl := now.Add(idle)
	if !d.explicit.IsZero() && d.explicit.Before(dl) {
		dl = d.explicit
	}
	return set(dl)
}

// Read reads from the connection, waiting at most the idle timeout.
func (c *IdleConn) Read(p []byte) (int, error) {
	if err := c.rd.apply(c.idle, c.Conn.SetReadDeadline, false, time.Time{}); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

// Write writes to the connection, waiting at most the idle timeout.
func (c *IdleConn) Write(p []byte) (int, error) {
	if err := c.wd.apply(c.idle, c.Conn.SetWriteDeadline, false, time.Time{}); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

// SetReadDeadline sets a deadline that reads end at, if the idle timeout
// does not end them first; the zero time removes it.
func (c *IdleConn) SetReadDeadline(t time.Time) error {
	return c.rd.apply(c.idle, c.Conn.SetReadDeadline, true, t)
}

// SetWriteDeadline is SetReadDeadline for writes.
func (c *IdleConn) SetWriteDeadline(t time.Time) error {
	return c.wd.apply(c.idle, c.Conn.SetWriteDeadline, true, t)
}

// SetDeadline sets both deadlines.
func (c *IdleConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// Close closes the connection and removes it from its Set. When the answer
// was sent before the client finished sending its request body (a 401 or
// 413 on an upload: LingerOnClose), closing at once would reset the
// connection and the client could lose the answer; so it first closes the
// sending side and reads (and discards) what the client still sends, for
// at most lingerTimeout.
func (c *IdleConn) Close() error {
	if c.set != nil {
		c.set.remove(c)
	}
	if tc, ok := c.Conn.(*net.TCPConn); ok && c.linger.Load() {
		_ = tc.CloseWrite()
		_ = tc.SetReadDeadline(time.Now().Add(lingerTimeout))
		_, _ = io.Copy(io.Discard, tc)
	}
	return c.Conn.Close()
}

// LingerOnClose marks the IdleConn under conn to linger when it is closed;
// a conn without one is left as it is. Safe for concurrent use.
func LingerOnClose(conn net.Conn) {
	if ic := AsIdleConn(conn); ic != nil {
		ic.linger.Store(true)
	}
}

// MarkServed records that a request of conn reached the app, so that
// Set.CloseUnserved leaves it open. Idempotent; safe for concurrent use.
func MarkServed(conn net.Conn) {
	if ic := AsIdleConn(conn); ic != nil && !ic.served.Load() {
		ic.served.Store(true)
	}
}

// RequestStarted is called by the app at the start of every request: its
// connection counts as served (MarkServed) and, on a Conn, the request's
// large body buffers are dropped when it ends (ConnState).
func RequestStarted(ctx *fasthttp.RequestCtx) {
	conn := ctx.Conn()
	MarkServed(conn)
	if pc := AsConn(conn); pc != nil {
		pc.ctx = ctx
	}
}

// AsIdleConn returns the *IdleConn under conn (possibly under TLS and a
// Conn), or nil.
func AsIdleConn(conn net.Conn) *IdleConn {
	if pc := AsConn(conn); pc != nil {
		conn = pc.Conn
	}
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	ic, _ := conn.(*IdleConn)
	return ic
}

// Set tracks a listener's open connections, so that Shutdown can close
// those that never sent a request: the server counts a new connection as
// busy from its first read on, so an unused keep-alive connection would
// otherwise hold Shutdown until the read timeout. Safe for concurrent use.
type Set struct {
	mu sync.Mutex
	m  map[*IdleConn]struct{}
}

// NewSet returns an empty Set.
func NewSet() *Set { return &Set{m: make(map[*IdleConn]struct{})} }

func (s *Set) add(c *IdleConn) {
	s.mu.Lock()
	s.m[c] = struct{}{}
	s.mu.Unlock()
}

func (s *Set) remove(c *IdleConn) {
	s.mu.Lock()
	delete(s.m, c)
	s.mu.Unlock()
}

// CloseUnserved closes the connections accepted at least age ago of which
// no request reached the app (MarkServed).
func (s *Set) CloseUnserved(age time.Duration) {
	var idle []*IdleConn
	s.mu.Lock()
	for c := range s.m {
		if !c.served.Load() && time.Since(c.accepted) >= age {
			idle = append(idle, c)
		}
	}
	s.mu.Unlock()
	for _, c := range idle {
		_ = c.Close()
	}
}

// Served returns how many open connections had a request reach the app.
func (s *Set) Served() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for c := range s.m {
		if c.served.Load() {
			n++
		}
	}
	return n
}

// idleListener wraps every accepted connection in an IdleConn tracked in set.
type idleListener struct {
	net.Listener
	idle time.Duration
	set  *Set
}

// NewIdleListener returns ln whose accepted connections are IdleConns of
// the idle timeout idle, tracked in set until they are closed.
func NewIdleListener(ln net.Listener, idle time.Duration, set *Set) net.Listener {
	return idleListener{Listener: ln, idle: idle, set: set}
}

func (l idleListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	ic := NewIdleConn(c, l.idle)
	ic.set, ic.accepted = l.set, time.Now()
	l.set.add(ic)
	return ic, nil
}
