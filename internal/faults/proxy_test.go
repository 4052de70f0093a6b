package faults

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// echoServer answers each line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

type lineConn struct {
	net.Conn
	r *bufio.Reader
}

func dialLine(t *testing.T, addr string) *lineConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return &lineConn{c, bufio.NewReader(c)}
}

// roundTrip sends a line and reads the echo, within d.
func (c *lineConn) roundTrip(d time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return "", err
	}
	return c.r.ReadString('\n')
}

func TestProxy_Faults(t *testing.T) {
	p, err := NewProxy(echoServer(t), 150*time.Millisecond)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })

	c := dialLine(t, p.Addr())
	got, err := c.roundTrip(5 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, "ping\n", got, "pass")

	p.Set(Latency)
	start := time.Now()
	_, err = c.roundTrip(5 * time.Second)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "latency on the way in and on the way out")

	p.Set(Blackhole)
	_, err = c.roundTrip(500 * time.Millisecond)
	var ne net.Error
	require.ErrorAs(t, err, &ne, "a blackhole answers nothing")
	assert.True(t, ne.Timeout(), "%v", err)
	p.Set(Pass)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = c.r.ReadString('\n')
	assert.Error(t, err, "the blackhole's end resets the connections it held")

	c2 := dialLine(t, p.Addr())
	_, err = c2.roundTrip(5 * time.Second)
	require.NoError(t, err, "healed")

	p.Set(Reset)
	_, err = c2.roundTrip(5 * time.Second)
	assert.Error(t, err, "reset: the open connection")
	if c3, err := net.Dial("tcp", p.Addr()); err == nil { // the reset may come before or after the dial ends
		_, err = (&lineConn{c3, bufio.NewReader(c3)}).roundTrip(5 * time.Second)
		assert.Error(t, err, "reset: a new connection")
		_ = c3.Close()
	}

	p.Set(Pass)
	c4 := dialLine(t, p.Addr())
	got, err = c4.roundTrip(5 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, "ping\n", got, "healed")
}

func TestProxy_CloseEndsEverything(t *testing.T) {
	p, err := NewProxy(echoServer(t), time.Millisecond)
	require.NoError(t, err)
	c := dialLine(t, p.Addr())
	_, err = c.roundTrip(5 * time.Second)
	require.NoError(t, err)
	p.Set(Blackhole)
	done := make(chan struct{})
	go func() { _, _ = c.roundTrip(10 * time.Second); close(done) }()
	require.NoError(t, p.Close()) // waits for every goroutine, the blackholed one too
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the client still waits after Close")
	}
}
