package gateway

import (
	"crypto/tls"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// lingerTimeout bounds how long Close keeps reading what a client still
// sends after an early answer (see idleConn.Close).
const lingerTimeout = time.Second

// idleConn bounds every wait on a connection by an idle timeout: each Read
// and Write may block at most idle (or until an earlier deadline set with
// Set*Deadline). Streams that keep moving, however long, are not cut. The
// deadline is refreshed at most every idle/16, so the effective idle limit
// lies between 15/16 idle and idle. Read and Write may be called from
// different goroutines.
type idleConn struct {
	net.Conn
	idle time.Duration
	rd   idleDeadline
	wd   idleDeadline

	linger atomic.Bool // Close lingers: the client may still be sending

	// Set by idleListener: the set the conn leaves on Close, when it was
	// accepted, and whether a request of it reached the app.
	set      *connSet
	accepted time.Time
	served   atomic.Bool
}

func newIdleConn(c net.Conn, idle time.Duration) *idleConn {
	return &idleConn{Conn: c, idle: idle}
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

func (c *idleConn) Read(p []byte) (int, error) {
	if err := c.rd.apply(c.idle, c.Conn.SetReadDeadline, false, time.Time{}); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

func (c *idleConn) Write(p []byte) (int, error) {
	if err := c.wd.apply(c.idle, c.Conn.SetWriteDeadline, false, time.Time{}); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

func (c *idleConn) SetReadDeadline(t time.Time) error {
	return c.rd.apply(c.idle, c.Conn.SetReadDeadline, true, t)
}

func (c *idleConn) SetWriteDeadline(t time.Time) error {
	return c.wd.apply(c.idle, c.Conn.SetWriteDeadline, true, t)
}

func (c *idleConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// Close closes the connection. When the answer was sent before the client
// finished sending its request body (a 401 or 413 on an upload), closing at
// once would reset the connection and the client could lose the answer; so
// it first closes the sending side and reads (and discards) what the client
// still sends, for at most lingerTimeout.
func (c *idleConn) Close() error {
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

// lingerOnClose marks conn to linger when it is closed.
func lingerOnClose(conn net.Conn) {
	if ic := asIdleConn(conn); ic != nil {
		ic.linger.Store(true)
	}
}

// markServed records that a request of conn reached the app.
func markServed(conn net.Conn) {
	if ic := asIdleConn(conn); ic != nil && !ic.served.Load() {
		ic.served.Store(true)
	}
}

// asIdleConn returns the *idleConn under conn (possibly under TLS), or nil.
func asIdleConn(conn net.Conn) *idleConn {
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	ic, _ := conn.(*idleConn)
	return ic
}

// connSet tracks a listener's open connections, so that Shutdown can close
// those that never sent a request: the server counts a new connection as
// busy from its first read on, so an unused keep-alive connection would
// otherwise hold Shutdown until the read timeout. Safe for concurrent use.
type connSet struct {
	mu sync.Mutex
	m  map[*idleConn]struct{}
}

func newConnSet() *connSet { return &connSet{m: make(map[*idleConn]struct{})} }

func (s *connSet) add(c *idleConn) {
	s.mu.Lock()
	s.m[c] = struct{}{}
	s.mu.Unlock()
}

func (s *connSet) remove(c *idleConn) {
	s.mu.Lock()
	delete(s.m, c)
	s.mu.Unlock()
}

// closeUnserved closes the connections accepted at least age ago of which
// no request reached the app.
func (s *connSet) closeUnserved(age time.Duration) {
	var idle []*idleConn
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

// idleListener wraps every accepted connection in an idleConn tracked in set.
type idleListener struct {
	net.Listener
	idle time.Duration
	set  *connSet
}

func (l idleListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	ic := newIdleConn(c, l.idle)
	ic.set, ic.accepted = l.set, time.Now()
	l.set.add(ic)
	return ic, nil
}
