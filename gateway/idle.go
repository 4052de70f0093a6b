package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
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

// asIdleConn returns the *idleConn under conn (possibly under TLS and a
// parkConn), or nil.
func asIdleConn(conn net.Conn) *idleConn {
	if pc := asParkConn(conn); pc != nil {
		conn = pc.Conn
	}
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

// maxKeptBody is the largest request or response body buffer a request
// context keeps for its next request; larger ones are dropped when their
// request ends (contexts are pooled: a kept buffer would travel on).
const maxKeptBody = 16 << 10

// parkListener serves connections with fasthttp's ServeConn only while they
// have a request to read. A connection waits for its first request, and
// for each next one, parked: in a goroutine of its own blocked on a
// one-byte read, holding none of the server's buffers, its request context
// or a handler-sized stack. When the byte arrives, a new goroutine serves
// the connection (the byte read again first) until the server waits for
// the next request: that read gets end of file from the parkConn, the
// server returns its buffers to its pools, and the connection parks again.
// A parked connection is closed after waitFirst (before its first request)
// or waitNext (between requests). Close closes the inner listener and
// every parked connection; wait waits for the connections being served.
//
// Accept (for fasthttp's Serve, whose Shutdown waits for the connections
// ServeConn serves) returns only the inner listener's lasting error or
// net.ErrClosed: the listener accepts and serves by itself, from the first
// call of Accept on (when the server is ready).
type parkListener struct {
	inner     net.Listener
	serve     func(net.Conn) error // the server's ServeConn
	waitFirst time.Duration
	waitNext  time.Duration
	retried   func(err error) // the inner Accept failed for want of files and is retried

	mu     sync.Mutex
	closed bool
	parked map[*parkConn]struct{}
	wg     sync.WaitGroup // the accept loop, parked and served connections

	failed    chan error // the accept loop's lasting error
	done      chan struct{}
	startOnce sync.Once
	closeOnce sync.Once
	closeErr  error
}

// Accept retries of an inner Accept that failed for want of file
// descriptors: from acceptBackoff, doubling, up to acceptBackoffMax.
const (
	acceptBackoff    = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

func newParkListener(inner net.Listener, serve func(net.Conn) error, waitFirst, waitNext time.Duration, retried func(error)) *parkListener {
	l := &parkListener{
		inner: inner, serve: serve, waitFirst: waitFirst, waitNext: waitNext, retried: retried,
		parked: make(map[*parkConn]struct{}),
		failed: make(chan error, 1), done: make(chan struct{}),
	}
	return l
}

func (l *parkListener) Addr() net.Addr { return l.inner.Addr() }

// Accept blocks until the listener is closed (net.ErrClosed) or the inner
// listener failed for good (its error).
func (l *parkListener) Accept() (net.Conn, error) {
	l.startOnce.Do(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if !l.closed {
			l.wg.Add(1)
			go l.acceptLoop()
		}
	})
	select {
	case err := <-l.failed:
		return nil, err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close closes the inner listener and the parked connections; connections
// being served finish their request. Idempotent.
func (l *parkListener) Close() error {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		parked := make([]*parkConn, 0, len(l.parked))
		for c := range l.parked {
			parked = append(parked, c)
		}
		l.mu.Unlock()
		l.closeErr = l.inner.Close()
		for _, c := range parked {
			_ = c.closeNow()
		}
		close(l.done)
	})
	return l.closeErr
}

// wait waits until the accept loop has ended and no connection is parked or
// served, or ctx ends. Call it after Close.
func (l *parkListener) wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *parkListener) acceptLoop() {
	defer l.wg.Done()
	backoff := acceptBackoff
	for {
		c, err := l.inner.Accept()
		if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
			if l.retried != nil {
				l.retried(err)
			}
			select {
			case <-l.done:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, acceptBackoffMax)
			continue
		}
		if err != nil {
			l.failed <- err
			return
		}
		backoff = acceptBackoff
		pc := newParkConn(c)
		l.wg.Add(1)
		go l.park(pc, true)
	}
}

// park waits for pc's next request (first: its first one), then serves it.
// A connection that sends nothing before the read timeout is served too:
// its read fails, and the server answers 408 as it did before parking.
func (l *parkListener) park(pc *parkConn, first bool) {
	defer l.wg.Done()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		_ = pc.closeNow()
		return
	}
	l.parked[pc] = struct{}{}
	l.mu.Unlock()
	wait := l.waitNext
	if first {
		wait = l.waitFirst
	}
	err := pc.waitRequest(wait)
	var ne net.Error
	if first && errors.As(err, &ne) && ne.Timeout() {
		pc.readErr, err = err, nil
	}
	l.mu.Lock()
	delete(l.parked, pc)
	closed := l.closed
	if err == nil && !closed {
		l.wg.Add(1) // before Close can see the listener closed: wait covers the serve
	}
	l.mu.Unlock()
	if err != nil || closed {
		_ = pc.closeNow()
		return
	}
	go l.serveConn(pc)
}

// serveConn serves pc until it is closed or waits for its next request.
func (l *parkListener) serveConn(pc *parkConn) {
	defer l.wg.Done()
	_ = l.serve(pc.outer) // errors are the connection's; the server logs none either
	if pc.parking.Swap(false) {
		l.wg.Add(1)
		go l.park(pc, false)
	}
}

// parkConn is a connection of a parkListener. Its fields other than the
// inner connection are used by one goroutine at a time: the parker, then
// the goroutine serving it (started after it), then the next parker.
type parkConn struct {
	net.Conn          // as accepted: an *idleConn, or TLS over one
	outer    net.Conn // what the server gets: c, or c with TLS's methods

	first   [1]byte
	replay  bool  // first holds a byte the server has not read yet
	readErr error // the server's next read fails with it (a first request that never came)
	idle    bool  // the server answered: its next read waits for a request
	// parking: the server did; Close leaves the connection to park. Atomic:
	// since fasthttp 1.58 the server's Shutdown closes idle connections
	// from its own goroutine.
	parking atomic.Bool
	// ctx is the request being served, whose body buffers are released
	// when it ends (set by Gateway.observe).
	ctx *fasthttp.RequestCtx

	closeOnce sync.Once
	closeErr  error
}

// parkTLSConn is a parkConn over TLS: the server sees a TLS connection.
type parkTLSConn struct {
	*parkConn
	tls *tls.Conn
}

func (c parkTLSConn) Handshake() error                     { return c.tls.Handshake() }
func (c parkTLSConn) ConnectionState() tls.ConnectionState { return c.tls.ConnectionState() }

func newParkConn(c net.Conn) *parkConn {
	pc := &parkConn{Conn: c}
	pc.outer = pc
	if tc, ok := c.(*tls.Conn); ok {
		pc.outer = parkTLSConn{parkConn: pc, tls: tc}
	}
	return pc
}

// asParkConn returns the *parkConn of conn, or nil.
func asParkConn(conn net.Conn) *parkConn {
	switch c := conn.(type) {
	case *parkConn:
		return c
	case parkTLSConn:
		return c.parkConn
	}
	return nil
}

// waitRequest waits up to d for the first byte of a request and keeps it
// for the server.
func (c *parkConn) waitRequest(d time.Duration) error {
	if err := c.Conn.SetReadDeadline(time.Now().Add(d)); err != nil {
		return err
	}
	n, err := c.Conn.Read(c.first[:])
	if n == 1 {
		c.replay = true
		return c.Conn.SetReadDeadline(time.Time{})
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

func (c *parkConn) Read(p []byte) (int, error) {
	switch {
	case len(p) == 0:
		return 0, nil
	case c.replay:
		c.replay = false
		p[0] = c.first[0]
		return 1, nil
	case c.readErr != nil:
		return 0, c.readErr
	case c.idle:
		// The server waits for the next request with nothing buffered:
		// it ends serving the connection, which then parks.
		c.idle = false
		c.parking.Store(true)
		return 0, io.EOF
	}
	return c.Conn.Read(p)
}

// Close closes the connection, unless the server is done with it because
// it waits for its next request: then it parks (parkListener.serveConn).
func (c *parkConn) Close() error {
	if c.parking.Load() {
		return nil
	}
	return c.closeNow()
}

func (c *parkConn) closeNow() error {
	c.closeOnce.Do(func() { c.closeErr = c.Conn.Close() })
	return c.closeErr
}

// connState follows the server's view of conn (fasthttp's ConnState hook):
// after an answer the server's next read waits for a request, and the
// request's large body buffers are dropped.
func connState(conn net.Conn, st fasthttp.ConnState) {
	c := asParkConn(conn)
	if c == nil {
		return
	}
	switch st {
	case fasthttp.StateIdle:
		if c.ctx != nil {
			c.ctx.Request.ReleaseBody(maxKeptBody)
			c.ctx.Response.ReleaseBody(maxKeptBody)
			c.ctx = nil
		}
		c.idle = true
	case fasthttp.StateActive:
		c.idle = false
	}
}
