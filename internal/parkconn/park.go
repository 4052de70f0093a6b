package parkconn

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

// maxKeptBody is the largest request or response body buffer a request
// context keeps for its next request; larger ones are dropped when their
// request ends (contexts are pooled: a kept buffer would travel on).
const maxKeptBody = 16 << 10

// Config says how long a Listener's connections stay parked.
type Config struct {
	// WaitFirst: a connection that sends no first request within it is
	// served anyway (its read fails, and the server answers as it does
	// without parking: fasthttp answers 408).
	WaitFirst time.Duration
	// WaitNext: a connection that sends no next request within it is
	// closed.
	WaitNext time.Duration
	// Linger: after an answer, the goroutine that served a connection
	// waits up to Linger for its next request before the connection parks.
	// A client that sends requests back to back is then served by one
	// goroutine and one ServeConn, without a park, a goroutine start and
	// the server's per-connection set-up for each request. A lingering
	// connection holds what a served one holds (the server's buffers and
	// request context, a grown stack), for at most Linger after an answer.
	// Zero: park at once.
	Linger time.Duration
	// Retried, when set, is called for each inner Accept that failed for
	// want of file descriptors (EMFILE, ENFILE) and is retried.
	Retried func(err error)
}

// Listener serves connections with fasthttp's ServeConn only while they
// have a request to read. A connection waits for its first request, and
// for each next one, parked: in a goroutine of its own blocked on a
// one-byte read, holding none of the server's buffers, its request context
// or a handler-sized stack. When the byte arrives, the goroutine that
// waited serves the connection (the byte read again first) until the
// server waits for the next request: that read gets end of file from the
// Conn, the server returns its buffers to its pools, and a new goroutine
// parks the connection again (the server must call ConnState), with a
// small stack; the one that served, its stack grown, ends. One goroutine
// start per request, not two: the hand-off from parker to server was one
// more wake-up on every request's path. With Config.Linger, the server's
// wait for the next request first waits that long on the goroutine that
// served: a request that comes within it is served there, with no park and
// no goroutine start. A parked connection is closed after
// Config.WaitNext (Config.WaitFirst before its first request: then it is
// served, as above). Close closes the inner listener and every parked
// connection; Wait waits for the connections being served.
//
// Accept (for fasthttp's Serve, whose Shutdown waits for the connections
// ServeConn serves) returns only the inner listener's lasting error or
// net.ErrClosed: the listener accepts and serves by itself, from the first
// call of Accept on (when the server is ready). Out of file descriptors,
// an inner Accept is retried, from acceptBackoff doubling up to
// acceptBackoffMax. Safe for concurrent use.
type Listener struct {
	inner net.Listener
	serve func(net.Conn) error // the server's ServeConn
	cfg   Config

	mu        sync.Mutex
	closed    bool
	parked    map[*Conn]struct{}
	lingering map[*Conn]struct{} // waiting for a next request on the goroutine that served them
	wg        sync.WaitGroup     // the accept loop, parked and served connections

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

// NewListener returns a Listener that accepts from inner and serves each
// connection with serve (fasthttp.Server.ServeConn). Nothing is accepted
// before the first call of Accept.
func NewListener(inner net.Listener, serve func(net.Conn) error, cfg Config) *Listener {
	return &Listener{
		inner: inner, serve: serve, cfg: cfg,
		parked: make(map[*Conn]struct{}), lingering: make(map[*Conn]struct{}),
		failed: make(chan error, 1), done: make(chan struct{}),
	}
}

// Addr returns the inner listener's address.
func (l *Listener) Addr() net.Addr { return l.inner.Addr() }

// Accept starts accepting, then blocks until the listener is closed
// (net.ErrClosed) or the inner listener failed for good (its error).
func (l *Listener) Accept() (net.Conn, error) {
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

// Close closes the inner listener and the connections that wait for a
// request, parked or lingering; connections being served finish their
// request. Idempotent: later calls return the first one's error.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		parked := make([]*Conn, 0, len(l.parked)+len(l.lingering))
		for c := range l.parked {
			parked = append(parked, c)
		}
		for c := range l.lingering {
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

// Wait waits until the accept loop has ended and no connection is parked or
// served, or ctx ends (its error). Call it after Close.
func (l *Listener) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Parked returns how many connections wait parked for a request.
func (l *Listener) Parked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.parked)
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	backoff := acceptBackoff
	for {
		c, err := l.inner.Accept()
		if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
			if l.cfg.Retried != nil {
				l.cfg.Retried(err)
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
		pc := newConn(c)
		pc.l = l
		l.wg.Add(1)
		go l.park(pc, true)
	}
}

// park waits for pc's next request (first: its first one), then serves it.
// A connection that sends nothing before the read timeout is served too:
// its read fails, and the server answers 408 as it did before parking.
func (l *Listener) park(pc *Conn, first bool) {
	defer l.wg.Done()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		_ = pc.closeNow()
		return
	}
	l.parked[pc] = struct{}{}
	l.mu.Unlock()
	wait := l.cfg.WaitNext
	if first {
		wait = l.cfg.WaitFirst
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
		l.wg.Add(1) // before Close can see the listener closed: Wait covers the serve
	}
	l.mu.Unlock()
	if err != nil || closed {
		_ = pc.closeNow()
		return
	}
	l.serveConn(pc)
}

// serveConn serves pc until it is closed or waits for its next request,
// on the goroutine that parked it. That goroutine's stack starts small; it
// is grown once at the start, while it holds almost nothing to copy,
// instead of doubling (and copying ever more) as the request goes deeper:
// that growth was 12% of the gateway's CPU in a profile of session runs.
func (l *Listener) serveConn(pc *Conn) {
	defer l.wg.Done()
	growStack(0)
	_ = l.serve(pc.outer) // errors are the connection's; the server logs none either
	if pc.parking.Swap(false) {
		l.wg.Add(1)
		go l.park(pc, false)
	}
}

// linger records c as lingering (on: false when the listener is closed) or
// no longer.
func (l *Listener) linger(c *Conn, on bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !on {
		delete(l.lingering, c)
		return true
	}
	if l.closed {
		return false
	}
	l.lingering[c] = struct{}{}
	return true
}

// Conn is a connection of a Listener, as the server gets it (over TLS, it
// is wrapped so that the server still sees a TLS connection: AsConn finds
// it). Its fields other than the inner connection are used by one
// goroutine at a time: the parker, then the goroutine serving it (started
// after it), then the next parker.
type Conn struct {
	net.Conn          // as accepted: an *IdleConn, or TLS over one
	outer    net.Conn // what the server gets: c, or c with TLS's methods

	first   [1]byte
	replay  bool      // first holds a byte the server has not read yet
	readErr error     // the server's next read fails with it (a first request that never came)
	l       *Listener // nil: the server's wait for a next request parks at once
	idle    bool      // the server answered: its next read waits for a request
	// parking: the server did; Close leaves the connection to park. Atomic:
	// since fasthttp 1.58 the server's Shutdown closes idle connections
	// from its own goroutine.
	parking atomic.Bool
	// ctx is the request being served, whose body buffers are released
	// when it ends (set by RequestStarted).
	ctx *fasthttp.RequestCtx

	closeOnce sync.Once
	closeErr  error
}

// tlsConn is a Conn over TLS: the server sees a TLS connection.
type tlsConn struct {
	*Conn
	tls *tls.Conn
}

func (c tlsConn) Handshake() error                     { return c.tls.Handshake() }
func (c tlsConn) ConnectionState() tls.ConnectionState { return c.tls.ConnectionState() }

func newConn(c net.Conn) *Conn {
	pc := &Conn{Conn: c}
	pc.outer = pc
	if tc, ok := c.(*tls.Conn); ok {
		pc.outer = tlsConn{Conn: pc, tls: tc}
	}
	return pc
}

// AsConn returns the *Conn of conn, as a Listener's server got it, or nil.
func AsConn(conn net.Conn) *Conn {
	switch c := conn.(type) {
	case *Conn:
		return c
	case tlsConn:
		return c.Conn
	}
	return nil
}

// waitRequest waits up to d for the first byte of a request and keeps it
// for the server.
func (c *Conn) waitRequest(d time.Duration) error {
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

// Read reads the byte the parker read first, then from the connection;
// once the server answered (ConnState), its next read is end of file and
// the connection parks.
func (c *Conn) Read(p []byte) (int, error) {
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
		// The server waits for the next request with nothing buffered: it
		// is served here if it comes within the linger; if not, the server
		// ends serving the connection, which then parks.
		c.idle = false
		if n, err := c.lingerRead(p); n > 0 || err != nil {
			return n, err
		}
		c.parking.Store(true)
		return 0, io.EOF
	}
	return c.Conn.Read(p)
}

// lingerRead reads the next request's first bytes if they come within the
// listener's linger. It returns 0 and no error when none came (or there is
// no linger): the connection is to park. Any other failure is the
// connection's; Close of the listener ends the wait with one.
func (c *Conn) lingerRead(p []byte) (int, error) {
	if c.l == nil || c.l.cfg.Linger <= 0 || !c.l.linger(c, true) {
		return 0, nil
	}
	defer c.l.linger(c, false)
	if err := c.Conn.SetReadDeadline(time.Now().Add(c.l.cfg.Linger)); err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(p)
	var ne net.Error
	if n == 0 && errors.As(err, &ne) && ne.Timeout() {
		return 0, c.Conn.SetReadDeadline(time.Time{})
	}
	if n > 0 {
		// The request has begun: the linger's deadline no longer
		// applies (the server sets its own, if it has one).
		if derr := c.Conn.SetReadDeadline(time.Time{}); err == nil {
			err = derr
		}
	}
	return n, err
}

// Close closes the connection, unless the server is done with it because
// it waits for its next request: then it parks (Listener.serveConn).
func (c *Conn) Close() error {
	if c.parking.Load() {
		return nil
	}
	return c.closeNow()
}

func (c *Conn) closeNow() error {
	c.closeOnce.Do(func() { c.closeErr = c.Conn.Close() })
	return c.closeErr
}

// ConnState is the server's ConnState hook (fasthttp.Server.ConnState): it
// follows the server's view of a Conn: after an answer the server's next
// read waits for a request, and the request's large body buffers are
// dropped. Other connections are left alone.
func ConnState(conn net.Conn, st fasthttp.ConnState) {
	c := AsConn(conn)
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

// serveStack is the stack a request's goroutine is grown to at its start
// (growStack): deeper than a session run through the proxy goes, measured
// with the gateway's CPU profile (no runtime.newstack left under serveConn).
const serveStack = 32 << 10

// growStack makes the runtime grow the calling goroutine's stack to hold a
// frame of about serveStack bytes. The frame is handed to a function the
// compiler cannot see into, so that it cannot be left out.
//
//go:noinline
func growStack(i int) byte {
	var frame [serveStack - 1024]byte
	return touchFrame(&frame, i)
}

//go:noinline
func touchFrame(f *[serveStack - 1024]byte, i int) byte {
	f[i]++
	return f[i]
}
