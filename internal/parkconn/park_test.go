package parkconn

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// testDeadline bounds every wait of these tests.
const testDeadline = 10 * time.Second

// eventually fails t unless cond holds within testDeadline.
func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, testDeadline, 5*time.Millisecond, msg)
}

// serveParked serves a fasthttp server that answers every request with its
// path, over a Listener on a loopback port, as the gateway wires it.
func serveParked(t *testing.T, cfg Config) (*Listener, *Set, string) {
	t.Helper()
	pl, set, addr, _ := serveCounted(t, cfg)
	return pl, set, addr
}

// serveCounted is serveParked that also counts the server's ServeConn
// calls.
func serveCounted(t *testing.T, cfg Config) (*Listener, *Set, string, *atomic.Int32) {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var serves atomic.Int32
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			RequestStarted(ctx)
			ctx.SetBodyString(string(ctx.Path()))
		},
		ConnState: ConnState,
	}
	set := NewSet()
	pl := NewListener(NewIdleListener(inner, time.Minute, set), func(c net.Conn) error {
		serves.Add(1)
		return srv.ServeConn(c)
	}, cfg)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(pl) }()
	t.Cleanup(func() {
		_ = pl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
		defer cancel()
		assert.NoError(t, pl.Wait(ctx), "nothing parked or served outlives the test")
		assert.NoError(t, <-served, "Serve ends when the listener is closed")
	})
	return pl, set, inner.Addr().String(), &serves
}

// get sends GET path on conn and returns the answer's body.
func get(t *testing.T, conn net.Conn, br *bufio.Reader, path string) string {
	t.Helper()
	require.NoError(t, conn.SetDeadline(time.Now().Add(testDeadline)))
	_, err := io.WriteString(conn, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	return string(b)
}

func TestListener_ParksBetweenRequests(t *testing.T) {
	pl, set, addr := serveParked(t, Config{WaitFirst: time.Minute, WaitNext: time.Minute})
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	eventually(t, func() bool { return pl.Parked() == 1 }, "a new connection parks until its first request")
	assert.Zero(t, set.Served())

	br := bufio.NewReader(conn)
	for _, path := range []string{"/a", "/b", "/c"} {
		assert.Equal(t, path, get(t, conn, br, path))
		eventually(t, func() bool { return pl.Parked() == 1 }, "the connection parks again after its answer")
	}
	assert.Equal(t, 1, set.Served(), "a request reached the app")

	// Close closes the parked connection at once.
	require.NoError(t, pl.Close())
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(testDeadline)))
	_, err = conn.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF)
}

// With a linger, requests that follow their answers within it are served
// by one ServeConn, with no park between them; without, each request is
// served by a ServeConn of its own, after a park.
func TestListener_LingerServesBackToBackRequestsWithoutParking(t *testing.T) {
	for _, tc := range []struct {
		linger time.Duration
		serves int32
	}{{0, 3}, {time.Hour, 1}} {
		t.Run(tc.linger.String(), func(t *testing.T) {
			pl, _, addr, serves := serveCounted(t, Config{WaitFirst: time.Minute, WaitNext: time.Minute, Linger: tc.linger})
			conn, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			defer conn.Close()
			br := bufio.NewReader(conn)
			for _, path := range []string{"/a", "/b", "/c"} {
				assert.Equal(t, path, get(t, conn, br, path))
			}
			assert.Equal(t, tc.serves, serves.Load(), "ServeConn calls for three requests")
			if tc.linger > 0 {
				assert.Zero(t, pl.Parked(), "a lingering connection is not parked")
			}
		})
	}
}

// A connection that sends nothing within the linger parks (and gives the
// server's buffers back); its next request is served after the park.
func TestListener_ParksAfterTheLinger(t *testing.T) {
	pl, _, addr, serves := serveCounted(t, Config{WaitFirst: time.Minute, WaitNext: time.Minute, Linger: 20 * time.Millisecond})
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	br := bufio.NewReader(conn)
	assert.Equal(t, "/a", get(t, conn, br, "/a"))
	eventually(t, func() bool { return pl.Parked() == 1 }, "the connection parks after the linger")
	assert.Equal(t, "/b", get(t, conn, br, "/b"))
	assert.Equal(t, int32(2), serves.Load(), "the request after the park is served by a new ServeConn")
}

// Close ends a linger at once, as it does a park: the connection is closed
// and nothing waits out the linger (the test's cleanup waits for every
// served connection within testDeadline, far below the linger).
func TestListener_CloseEndsALinger(t *testing.T) {
	pl, _, addr := serveParked(t, Config{WaitFirst: time.Minute, WaitNext: time.Minute, Linger: time.Hour})
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	assert.Equal(t, "/a", get(t, conn, bufio.NewReader(conn), "/a"))
	eventually(t, func() bool {
		pl.mu.Lock()
		defer pl.mu.Unlock()
		return len(pl.lingering) == 1
	}, "the connection lingers after its answer")
	require.NoError(t, pl.Close())
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(testDeadline)))
	_, err = conn.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "Close closed the lingering connection")
}

// A client that closes its connection while it lingers ends it: the server
// is done with it and it does not park.
func TestListener_AClientThatLeavesDuringTheLingerIsNotParked(t *testing.T) {
	pl, set, addr, _ := serveCounted(t, Config{WaitFirst: time.Minute, WaitNext: time.Minute, Linger: time.Hour})
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	assert.Equal(t, "/a", get(t, conn, bufio.NewReader(conn), "/a"))
	require.NoError(t, conn.Close())
	eventually(t, func() bool { return set.Served() == 0 }, "the server closed the connection")
	assert.Zero(t, pl.Parked())
}

func TestListener_ClosesAfterWaitNext(t *testing.T) {
	pl, _, addr := serveParked(t, Config{WaitFirst: time.Minute, WaitNext: 100 * time.Millisecond})
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	assert.Equal(t, "/a", get(t, conn, bufio.NewReader(conn), "/a"))
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(testDeadline)))
	_, err = conn.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "closed after waiting WaitNext for its next request")
	eventually(t, func() bool { return pl.Parked() == 0 }, "nothing stays parked")
}

// A connection whose first request does not come within WaitFirst is
// served all the same, and the server's first read fails with the timeout.
func TestListener_FirstRequestTimeoutReachesTheServer(t *testing.T) {
	inner := &scriptedListener{conns: make(chan net.Conn, 1), closed: make(chan struct{})}
	server, client := net.Pipe()
	defer client.Close()
	inner.conns <- server
	readErr := make(chan error, 1)
	pl := NewListener(inner, func(c net.Conn) error {
		_, err := c.Read(make([]byte, 1))
		readErr <- err
		return c.Close()
	}, Config{WaitFirst: 50 * time.Millisecond, WaitNext: time.Minute})
	go func() { _, _ = pl.Accept() }()
	select {
	case err := <-readErr:
		var ne net.Error
		assert.True(t, errors.As(err, &ne) && ne.Timeout(), "a timeout: %v", err)
	case <-time.After(testDeadline):
		t.Fatal("the connection was not served")
	}
	require.NoError(t, pl.Close())
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	require.NoError(t, pl.Wait(ctx))
}

// scriptedListener returns its errors, then its connections, then blocks
// until closed.
type scriptedListener struct {
	errs   []error
	conns  chan net.Conn
	closed chan struct{}
}

func (l *scriptedListener) Accept() (net.Conn, error) {
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		return nil, err
	}
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}
func (l *scriptedListener) Close() error   { close(l.closed); return nil }
func (l *scriptedListener) Addr() net.Addr { return &net.TCPAddr{} }

// Out of file descriptors, accepting is retried (counted), not given up:
// fasthttp's own loop returned such an error from Serve.
func TestListener_RetriesAcceptOutOfFiles(t *testing.T) {
	emfile := &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
	inner := &scriptedListener{errs: []error{emfile, emfile}, conns: make(chan net.Conn, 1), closed: make(chan struct{})}
	server, client := net.Pipe()
	inner.conns <- server
	var retried atomic.Int32
	served := make(chan string, 1)
	pl := NewListener(inner, func(c net.Conn) error {
		b := make([]byte, 5)
		_, err := io.ReadFull(c, b)
		served <- string(b)
		return errors.Join(err, c.Close())
	}, Config{WaitFirst: time.Minute, WaitNext: time.Minute, Retried: func(err error) {
		assert.ErrorIs(t, err, syscall.EMFILE)
		retried.Add(1)
	}})
	accepted := make(chan error, 1)
	go func() { _, err := pl.Accept(); accepted <- err }()
	go func() { _, _ = io.WriteString(client, "hello") }()
	select {
	case got := <-served:
		assert.Equal(t, "hello", got, "the first byte is read again by the server")
	case <-time.After(testDeadline):
		t.Fatal("the connection was not served")
	}
	assert.Equal(t, int32(2), retried.Load())
	require.NoError(t, pl.Close())
	assert.ErrorIs(t, <-accepted, net.ErrClosed)
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	require.NoError(t, pl.Wait(ctx))
	_ = client.Close()
}
