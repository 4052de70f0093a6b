package parkconn

import (
	"bufio"
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"

	"github.com/quarryhq/quarry/internal/leaktest"
)

// A listener that parked and served connections, once closed and waited
// for, leaves no goroutine of its own or of the connections behind.
func TestListener_CloseLeavesNoGoroutine(t *testing.T) {
	defer goleak.VerifyNone(t, append(leaktest.FastHTTP(), goleak.IgnoreCurrent())...)
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { RequestStarted(ctx) }, ConnState: ConnState}
	set := NewSet()
	pl := NewListener(NewIdleListener(inner, time.Minute, set), srv.ServeConn, Config{WaitFirst: time.Minute, WaitNext: time.Minute})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(pl) }()
	var conns []net.Conn
	for range 3 {
		conn, err := net.Dial("tcp", inner.Addr().String())
		require.NoError(t, err)
		conns = append(conns, conn)
		get(t, conn, bufio.NewReader(conn), "/x")
	}
	eventually(t, func() bool { return pl.Parked() == 3 }, "the connections park")
	require.NoError(t, pl.Close())
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	require.NoError(t, pl.Wait(ctx))
	assert.NoError(t, <-served)
	for _, c := range conns {
		_ = c.Close()
	}
}
