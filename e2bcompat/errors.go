package e2bcompat

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/errclass"
)

// Error is E2B's error body (openapi.yml, Error): the HTTP status as an
// integer code, the message, and a machine-readable error_code, which
// carries Quarry's code (errclass). The SDK shows "code: message".
type Error struct {
	Code      int    `json:"code"`
	ErrorCode string `json:"error_code,omitempty"`
	Message   string `json:"message"`
}

// ErrorOf renders a classification as the control plane answers it: a
// lease that ended (410) is 404, which is what E2B answers for a killed
// sandbox and what the SDK's kill, connect and get_info read as "not found".
func ErrorOf(a errclass.Class) Error {
	status := a.Status
	if status == http.StatusGone {
		status = http.StatusNotFound
	}
	return Error{Code: status, ErrorCode: a.Code, Message: a.Message}
}

// WriteError answers c with err, classified once (errclass.Of), in E2B's
// Error body (ErrorOf), replacing whatever answer c had; a retryable 503
// carries Retry-After (retryAfter). It returns the classification, for the
// caller's log.
func WriteError(c *fiber.Ctx, err error, retryAfter time.Duration) errclass.Class {
	a := errclass.Of(err)
	e := ErrorOf(a)
	reset(c, a, retryAfter)
	_ = c.Status(e.Code).JSON(e)
	return a
}

// reset clears c's answer and sets Retry-After on a retryable 503.
func reset(c *fiber.Ctx, a errclass.Class, retryAfter time.Duration) {
	c.Response().Reset()
	if a.Retryable && a.Status == http.StatusServiceUnavailable {
		c.Set(fiber.HeaderRetryAfter, errclass.RetryAfter(retryAfter))
	}
}

// WriteProxyError answers a data-plane request that the gateway refused
// before reaching the sandbox (bad routing headers, a refused token, the
// sandbox's lease unknown or ended, its agent unreachable) with err,
// classified once: the agent's own answers never come here. A sandbox that
// is unknown or ended answers as E2B's proxy does for a sandbox that is not
// running: 502 (the SDK's is_running() reads it as false). A Connect RPC
// (POST /pkg.Service/Method) gets Connect's error: JSON for a unary call, an
// end-of-stream frame for a streaming one (Content-Type
// application/connect+json); anything else E2B's Error body. It returns
// the classification, for the caller's log.
func WriteProxyError(c *fiber.Ctx, err error, retryAfter time.Duration) errclass.Class {
	a := errclass.Of(err)
	reset(c, a, retryAfter)
	status := a.Status
	if status == http.StatusNotFound || status == http.StatusGone {
		status = http.StatusBadGateway
	}
	if !isRPC(c.Path()) {
		_ = c.Status(status).JSON(Error{Code: status, ErrorCode: a.Code, Message: a.Message})
		return a
	}
	code := connectCode(status)
	if bytes.HasPrefix(c.Request().Header.ContentType(), []byte("application/connect+")) {
		c.Status(http.StatusOK)
		c.Set(fiber.HeaderContentType, "application/connect+json")
		_ = c.Send(EndStream(code, a.Message))
		return a
	}
	_ = c.Status(connectStatus[code]).JSON(connectError{Code: code, Message: a.Message})
	return a
}

// isRPC reports whether path is a Connect procedure: "/pkg.Service/Method".
func isRPC(path string) bool {
	svc, method, ok := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	return ok && strings.Contains(svc, ".") && method != "" && !strings.Contains(method, "/")
}

// connectError is the Connect protocol's error: a code and a message.
type connectError struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
}

// connectCode is the Connect code of an HTTP status (the Connect
// protocol's mapping, with the statuses the gateway answers).
func connectCode(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid_argument"
	case http.StatusUnauthorized:
		return "unauthenticated"
	case http.StatusForbidden:
		return "permission_denied"
	case http.StatusNotFound:
		return "not_found"
	case http.StatusConflict:
		return "aborted"
	case http.StatusRequestEntityTooLarge, http.StatusTooManyRequests:
		return "resource_exhausted"
	case http.StatusNotImplemented:
		return "unimplemented"
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		return "unavailable"
	case http.StatusGatewayTimeout:
		return "deadline_exceeded"
	}
	return "internal"
}

// connectStatus is the HTTP status of a unary Connect error by its code.
var connectStatus = map[string]int{
	"invalid_argument": http.StatusBadRequest, "unauthenticated": http.StatusUnauthorized,
	"permission_denied": http.StatusForbidden, "not_found": http.StatusNotFound,
	"aborted": http.StatusConflict, "resource_exhausted": http.StatusTooManyRequests,
	"unimplemented": http.StatusNotImplemented, "unavailable": http.StatusServiceUnavailable,
	"deadline_exceeded": http.StatusGatewayTimeout, "internal": http.StatusInternalServerError,
}

// EndStream returns a Connect streaming response's last frame carrying an
// error: flags 0x02 (end of stream), a 4-byte big-endian length, and the
// JSON {"error": {"code", "message"}}.
func EndStream(code, message string) []byte {
	body, _ := json.Marshal(struct {
		Error connectError `json:"error"`
	}{connectError{Code: code, Message: message}})
	frame := make([]byte, 5, 5+len(body))
	frame[0] = 0x02
	binary.BigEndian.PutUint32(frame[1:], uint32(len(body)))
	return append(frame, body...)
}
