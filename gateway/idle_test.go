package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// gatewayWithAgent starts a gateway with one lease, sbx-1 of testKey, whose
// agent answers every call with answer (JSON).
func gatewayWithAgent(t testing.TB, answer []byte) (gw *testGateway, agent *httptest.Server) {
	t.Helper()
	agent = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	}))
	t.Cleanup(agent.Close)
	mgr := newFakeManager(agent.URL)
	mgr.addLease("sbx-1", testKey, agent.URL, 1)
	return startGateway(t, mgr, nil), agent
}

// rawCall writes req on conn and reads one answer whole, leaving nothing
// buffered (the connection can be used raw again).
func rawCall(t testing.TB, conn net.Conn, req string) (int, []byte) {
	t.Helper()
	require.NoError(t, conn.SetDeadline(time.Now().Add(testDeadline)))
	defer conn.SetDeadline(time.Time{})
	_, err := io.WriteString(conn, req)
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Zero(t, br.Buffered(), "nothing after the answer")
	return resp.StatusCode, b
}

// parked returns how many connections of g wait parked for a request.
func (g *Gateway) parked() int {
	g.parksMu.Lock()
	defer g.parksMu.Unlock()
	n := 0
	for _, pl := range g.parks {
		n += pl.Parked()
	}
	return n
}

const healthzReq = "GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n"

// An idle keep-alive connection holds none of the server's buffers: not
// the 16 KiB read buffer, the write buffer and the request context, nor the
// 256 KiB answer it carried last (a connection kept them all while it
// waited for its next request: about 300 KiB each here).
func TestGateway_IdleConnections_HoldNoServerBuffers(t *testing.T) {
	answer, err := json.Marshal(agentapi.ExecResult{Stdout: strings.Repeat("x", 256<<10)})
	require.NoError(t, err)
	gw, _ := gatewayWithAgent(t, answer)
	addr := strings.TrimPrefix(gw.URL, "http://")
	body := `{"command":"true"}`
	exec := fmt.Sprintf("POST /v1/sandboxes/sbx-1/exec HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		testKey, len(body), body)
	call := func() net.Conn {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		status, b := rawCall(t, conn, exec)
		require.Equal(t, http.StatusOK, status, "%.200s", b)
		require.Greater(t, len(b), 256<<10)
		return conn
	}
	call() // the agent client and the pools exist from here on
	eventually(t, func() bool { return gw.parked() == 1 }, "the connection parks")

	const n = 200
	before := liveBytes()
	for range n {
		call()
	}
	eventually(t, func() bool { return gw.parked() == n+1 }, "every connection parks")
	per := float64(int64(liveBytes())-int64(before)) / n
	t.Logf("%.0f bytes per idle connection (heap and stacks, both ends of the connection)", per)
	assert.Less(t, per, float64(16<<10), "an idle connection costs its socket and a parked goroutine, no server buffers")
}

func TestGateway_KeepAlive_RequestsAcrossParking(t *testing.T) {
	gw := startGateway(t, newFakeManager(""), nil)
	conn, err := net.Dial("tcp", strings.TrimPrefix(gw.URL, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	for i := range 50 {
		status, _ := rawCall(t, conn, healthzReq)
		require.Equal(t, http.StatusOK, status, "request %d on one connection", i)
		eventually(t, func() bool { return gw.parked() == 1 }, "the connection parks between requests")
	}

	// Pipelined requests are in the server's read buffer: none is lost to
	// parking, and they are answered in order.
	require.NoError(t, conn.SetDeadline(time.Now().Add(testDeadline)))
	_, err = io.WriteString(conn, healthzReq+"GET /openapi.json HTTP/1.1\r\nHost: gw\r\n\r\n"+healthzReq)
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	for i, want := range []string{"/healthz", "/openapi.json", "/healthz"} {
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err, "answer %d", i)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, resp.StatusCode, want)
		assert.Equal(t, want == "/openapi.json", strings.Contains(string(b), `"openapi"`), "answer %d is %s's", i, want)
	}
}

func TestGateway_ParkedConnections_Close(t *testing.T) {
	t.Run("after the idle timeout", func(t *testing.T) {
		gw := startGateway(t, newFakeManager(""), func(c *Config) { c.IdleTimeout = 200 * time.Millisecond })
		conn, err := net.Dial("tcp", strings.TrimPrefix(gw.URL, "http://"))
		require.NoError(t, err)
		defer conn.Close()
		status, _ := rawCall(t, conn, healthzReq)
		require.Equal(t, http.StatusOK, status)
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(testDeadline)))
		_, err = conn.Read(make([]byte, 1))
		assert.ErrorIs(t, err, io.EOF, "the gateway closed the idle connection")
		eventually(t, func() bool { return gw.parked() == 0 }, "nothing stays parked")
	})
	t.Run("before a first request, after the read timeout, with 408", func(t *testing.T) {
		gw := startGateway(t, newFakeManager(""), func(c *Config) { c.ReadTimeout = 200 * time.Millisecond })
		conn, err := net.Dial("tcp", strings.TrimPrefix(gw.URL, "http://"))
		require.NoError(t, err)
		defer conn.Close()
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(testDeadline)))
		b, err := io.ReadAll(conn)
		require.NoError(t, err, "the answer, then end of file")
		resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(string(b))), nil)
		require.NoError(t, err, "%s", b)
		assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode, "as the server answered before parking")
		body, _ := io.ReadAll(resp.Body)
		assert.Equal(t, "timeout", decodeError(t, body).Code)
	})
	t.Run("at shutdown, at once", func(t *testing.T) {
		gw := startGateway(t, newFakeManager(""), nil)
		conn, err := net.Dial("tcp", strings.TrimPrefix(gw.URL, "http://"))
		require.NoError(t, err)
		defer conn.Close()
		status, _ := rawCall(t, conn, healthzReq)
		require.Equal(t, http.StatusOK, status)
		eventually(t, func() bool { return gw.parked() == 1 }, "the connection parks")
		ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
		defer cancel()
		start := time.Now()
		require.NoError(t, gw.Shutdown(ctx))
		assert.Less(t, time.Since(start), 5*time.Second, "a parked connection does not hold Shutdown")
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(testDeadline)))
		_, err = conn.Read(make([]byte, 1))
		assert.ErrorIs(t, err, io.EOF)
	})
}
