package gateway

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A request whose Content-Length is over its limit is answered 413 before
// its body is read (docs/API.md, "Limits and timeouts"): a client that sent
// its headers and part of its body, and waits for an answer before sending
// the rest, gets it. The server's timeouts are longer than the wait, so a
// gateway that waits for the body fails here rather than answering late.
func TestBody_DeclaredLengthOverLimitIs413BeforeTheBody(t *testing.T) {
	mgr := newFakeManager("")
	mgr.addLease("sbx-1", testKey, "", 1)
	gw := startGateway(t, mgr, func(c *Config) {
		c.MaxJSONBody, c.MaxUploadBody = 64<<10, 1<<20
		c.ReadTimeout, c.UploadTimeout, c.IdleTimeout = time.Hour, time.Hour, time.Hour
	})
	addr := strings.TrimPrefix(gw.URL, "http://")
	tests := []struct {
		name   string
		method string
		path   string
		length int    // the declared Content-Length
		sent   int    // the bytes of body sent before waiting
		hdr    string // more header lines
	}{
		{name: "json, headers only", method: http.MethodPost, path: "/v1/sandboxes", length: 1 << 20},
		{name: "json, a little body", method: http.MethodPost, path: "/v1/sandboxes", length: 1 << 20, sent: 1 << 10},
		{name: "json, 20 KB", method: http.MethodPost, path: "/v1/sandboxes", length: 1 << 20, sent: 20_000},
		{name: "json, unauthenticated", method: http.MethodPost, path: "/v1/sandboxes", length: 1 << 20, sent: 20_000, hdr: "Authorization: Bearer nope\r\n"},
		{name: "json, expecting 100-continue", method: http.MethodPost, path: "/v1/sandboxes", length: 1 << 20, hdr: "Expect: 100-continue\r\n"},
		{name: "upload, 20 KB", method: http.MethodPut, path: "/v1/sandboxes/sbx-1/files?path=big", length: 2 << 20, sent: 20_000},
		{name: "a route's own smaller limit (heartbeat)", method: http.MethodPost, path: "/v1/sandboxes/sbx-1/heartbeat", length: 60 << 10, sent: 20_000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			defer conn.Close()
			hdr := tt.hdr
			if !strings.Contains(hdr, "Authorization") {
				hdr += "Authorization: Bearer " + testKey + "\r\n"
			}
			req := tt.method + " " + tt.path + " HTTP/1.1\r\nHost: quarry.test\r\nContent-Type: application/json\r\n" + hdr +
				"Content-Length: " + strconv.Itoa(tt.length) + "\r\n\r\n" + strings.Repeat("x", tt.sent)
			_, err = io.WriteString(conn, req)
			require.NoError(t, err)
			// A hang guard, not a speed claim: the server's timeouts are an hour.
			require.NoError(t, conn.SetReadDeadline(time.Now().Add(testDeadline)))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			require.NoError(t, err, "an answer before the rest of the body is sent")
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "%s", body)
			assert.Equal(t, "payload_too_large", decodeError(t, body).Code)
			assert.True(t, resp.Close, "the rest of the body is never read as a request: the connection closes")
		})
	}
}
