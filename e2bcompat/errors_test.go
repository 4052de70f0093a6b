package e2bcompat

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/warmpool"
)

// answer serves one request whose handler renders err with write.
func answer(t *testing.T, write func(*fiber.Ctx, error, time.Duration) errclass.Class, err error, method, path, ct string) (*http.Response, []byte) {
	t.Helper()
	app := fiber.New()
	app.Use(func(c *fiber.Ctx) error {
		write(c, err, 3*time.Second)
		return nil
	})
	req := httptest.NewRequest(method, path, nil)
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	resp, e := app.Test(req)
	require.NoError(t, e)
	b, e := io.ReadAll(resp.Body)
	require.NoError(t, e)
	return resp, b
}

func TestWriteError_E2BsBody(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		status int
		code   string
	}{
		{"bad input", badinput.New("timeout", "must be positive"), 400, "bad_request"},
		{"unauthorized", errclass.Unauthorized("invalid API key"), 401, "unauthorized"},
		{"unknown sandbox", errclass.Sandbox("sbx-1", warmpool.ErrNotFound), 404, "not_found"},
		{"ended lease is not found", errclass.Sandbox("sbx-1", warmpool.ErrLeaseEnded), 404, "gone"},
		{"no capacity", warmpool.ErrNoCapacity, 503, "no_capacity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := answer(t, WriteError, tc.err, http.MethodPost, "/sandboxes", "")
			assert.Equal(t, tc.status, resp.StatusCode, "%s", b)
			var e map[string]any
			require.NoError(t, json.Unmarshal(b, &e))
			assert.EqualValues(t, tc.status, e["code"], "code is the status, an int")
			assert.Equal(t, tc.code, e["error_code"])
			assert.NotEmpty(t, e["message"])
			if tc.status == 503 {
				assert.Equal(t, "3", resp.Header.Get("Retry-After"))
			}
		})
	}
}

func TestWriteProxyError_ByPlane(t *testing.T) {
	gone := errclass.Sandbox("sbx-1", warmpool.ErrLeaseEnded)
	t.Run("files: E2B's body, a sandbox gone is 502", func(t *testing.T) {
		resp, b := answer(t, WriteProxyError, gone, http.MethodGet, "/files?path=a", "")
		assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
		var e Error
		require.NoError(t, json.Unmarshal(b, &e))
		assert.Equal(t, 502, e.Code)
		assert.Equal(t, "gone", e.ErrorCode)
	})
	t.Run("health of an unknown sandbox is 502", func(t *testing.T) {
		resp, _ := answer(t, WriteProxyError, errclass.Sandbox("x", warmpool.ErrNotFound), http.MethodGet, "/health", "")
		assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	})
	t.Run("unary rpc: Connect's error", func(t *testing.T) {
		resp, b := answer(t, WriteProxyError, errclass.Unauthorized("no token"), http.MethodPost, "/filesystem.Filesystem/Stat", "application/json")
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		assert.JSONEq(t, `{"code": "unauthenticated", "message": "no token"}`, string(b))
		resp, b = answer(t, WriteProxyError, gone, http.MethodPost, "/filesystem.Filesystem/Stat", "application/json")
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		assert.Contains(t, string(b), `"code":"unavailable"`)
	})
	t.Run("streaming rpc: an end-of-stream frame", func(t *testing.T) {
		resp, b := answer(t, WriteProxyError, gone, http.MethodPost, "/process.Process/Start", "application/connect+json")
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "application/connect+json", resp.Header.Get("Content-Type"))
		require.Greater(t, len(b), 5)
		assert.Equal(t, byte(0x02), b[0])
		assert.Equal(t, uint32(len(b)-5), binary.BigEndian.Uint32(b[1:5]))
		var end struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		require.NoError(t, json.Unmarshal(b[5:], &end))
		assert.Equal(t, "unavailable", end.Error.Code)
		assert.Contains(t, end.Error.Message, "sbx-1")
	})
}

func TestIsRPC(t *testing.T) {
	assert.True(t, isRPC("/process.Process/Start"))
	assert.True(t, isRPC("/filesystem.Filesystem/ListDir"))
	for _, p := range []string{"/files", "/health", "/v1/exec", "/process.Process/", "/a.b/c/d", "/"} {
		assert.False(t, isRPC(p), p)
	}
}
