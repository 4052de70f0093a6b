package parkconn

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	server, err = ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { _ = server.Close(); _ = client.Close() })
	return server, client
}

func TestIdleConn_SilentReadEndsAfterIdle(t *testing.T) {
	server, _ := tcpPair(t)
	ic := NewIdleConn(server, 100*time.Millisecond)
	start := time.Now()
	_, err := ic.Read(make([]byte, 1))
	assert.True(t, errors.Is(err, os.ErrDeadlineExceeded), "%v", err)
	assert.Less(t, time.Since(start), testDeadline)
}

// A stream that keeps moving is not cut, however long it lasts: the client
// writes a byte each time the reader has read the last one, until the
// stream has lasted three idle timeouts, so no read waits long while the
// whole outlasts the timeout.
func TestIdleConn_MovingStreamOutlastsIdle(t *testing.T) {
	const idle = 200 * time.Millisecond
	server, client := tcpPair(t)
	ic := NewIdleConn(server, idle)
	read := make(chan struct{})
	written := make(chan int, 1)
	go func() {
		n := 0
		for start := time.Now(); time.Since(start) < 3*idle; n++ {
			if _, err := client.Write([]byte("x")); err != nil {
				break
			}
			select {
			case <-read:
			case <-time.After(testDeadline):
			}
		}
		written <- n
		_ = client.Close()
	}()
	var b []byte
	one := make([]byte, 1)
	var err error
	for {
		var k int
		k, err = ic.Read(one)
		b = append(b, one[:k]...)
		if err != nil {
			break
		}
		read <- struct{}{}
	}
	if errors.Is(err, io.EOF) {
		err = nil
	}
	require.NoError(t, err, "three idle timeouts of reads, none waiting long")
	assert.Len(t, b, <-written)
}

func TestIdleConn_EarlierExplicitDeadlineWins(t *testing.T) {
	server, _ := tcpPair(t)
	ic := NewIdleConn(server, time.Minute)
	require.NoError(t, ic.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	_, err := ic.Read(make([]byte, 1))
	assert.True(t, errors.Is(err, os.ErrDeadlineExceeded), "%v", err)
}

func TestSet_CloseUnservedClosesOnlyOldUnservedConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	set := NewSet()
	il := NewIdleListener(ln, time.Minute, set)
	defer il.Close()
	accept := func() (net.Conn, net.Conn) {
		client, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { _ = client.Close() })
		c, err := il.Accept()
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c, client
	}
	served, servedClient := accept()
	MarkServed(served)
	_, unservedClient := accept()
	assert.Equal(t, 1, set.Served())

	set.CloseUnserved(time.Hour)
	require.NoError(t, unservedClient.SetReadDeadline(time.Now().Add(100*time.Millisecond)))
	_, err = unservedClient.Read(make([]byte, 1))
	assert.True(t, errors.Is(err, os.ErrDeadlineExceeded), "younger than the age: left open (%v)", err)

	set.CloseUnserved(0)
	for name, c := range map[string]net.Conn{"unserved": unservedClient, "served": servedClient} {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Second)))
		_, err = c.Read(make([]byte, 1))
		if name == "unserved" {
			assert.ErrorIs(t, err, io.EOF, "closed")
		} else {
			assert.True(t, errors.Is(err, os.ErrDeadlineExceeded), "a served connection is left open (%v)", err)
		}
	}
	assert.Equal(t, 1, set.Served(), "the closed connection left the set")
}
