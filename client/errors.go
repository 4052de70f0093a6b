package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/quarryhq/quarry/api"
)

// maxErrorBody bounds how much of an error answer is read.
const maxErrorBody = 64 << 10

// Error is a non-2xx answer of the gateway, decoded from its error shape
// {"error": {"code": "...", "message": "..."}}, or an "error" event of a
// stream (then Status is 0). When the body is not that shape (a proxy in
// between, say), Code is the status text and Message the body's first bytes.
type Error struct {
	Status  int    // HTTP status; 0 for an error event inside a stream
	Code    string // e.g. api.CodeNotFound ("not_found")
	Message string // the gateway's message, meant for a person
	// RetryAfter is the Retry-After of a 503 (no_capacity, unavailable); 0 when absent.
	RetryAfter time.Duration
}

// Error returns the gateway's message with status and code, on one line.
func (e *Error) Error() string {
	msg := e.Message
	if msg == "" {
		msg = e.Code
	}
	if e.Status == 0 {
		return fmt.Sprintf("%s (%s)", msg, e.Code)
	}
	return fmt.Sprintf("%s (%d %s)", msg, e.Status, e.Code)
}

// checkResponse returns nil for a 2xx answer; otherwise it reads (a bounded
// part of) the body and returns an *Error. It does not close the body.
func checkResponse(resp *http.Response) error {
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	e := &Error{Status: resp.StatusCode, RetryAfter: retryAfter(resp.Header.Get("Retry-After"))}
	var eb api.ErrorBody
	if json.Unmarshal(b, &eb) == nil && eb.Error.Code != "" {
		e.Code, e.Message = eb.Error.Code, oneLine(eb.Error.Message)
		return e
	}
	e.Code = http.StatusText(resp.StatusCode)
	e.Message = oneLine(string(b))
	return e
}

// retryAfter parses a Retry-After header given in seconds (the gateway's
// form); anything else is 0.
func retryAfter(v string) time.Duration {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}

// oneLine trims s, joins its lines and cuts it to a readable length.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	const maxLen = 512
	if len(s) > maxLen {
		s = s[:maxLen] + "…"
	}
	return s
}

// HasCode reports whether err is, or wraps, an *Error with the given code.
func HasCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// hasStatusOrCode reports whether err is, or wraps, an *Error with the given
// status or one of the codes.
func hasStatusOrCode(err error, status int, codes ...string) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	if e.Status == status {
		return true
	}
	for _, c := range codes {
		if e.Code == c {
			return true
		}
	}
	return false
}

// IsBadRequest reports a 400: the input was malformed; the message names the field.
func IsBadRequest(err error) bool {
	return hasStatusOrCode(err, http.StatusBadRequest, api.CodeBadRequest)
}

// IsUnauthorized reports a 401: the API key is missing or wrong.
func IsUnauthorized(err error) bool {
	return hasStatusOrCode(err, http.StatusUnauthorized, api.CodeUnauthorized)
}

// IsNotFound reports a 404: an unknown sandbox (or another key's), session,
// process or file.
func IsNotFound(err error) bool {
	return hasStatusOrCode(err, http.StatusNotFound, api.CodeNotFound)
}

// IsConflict reports a 409: a concurrent change, or a busy session.
func IsConflict(err error) bool {
	return hasStatusOrCode(err, http.StatusConflict, api.CodeConflict, api.CodeBusy)
}

// IsBusy reports a 409 "busy": the session is already running a command.
func IsBusy(err error) bool { return HasCode(err, api.CodeBusy) }

// IsGone reports a 410: the sandbox's lease was released, expired or lost.
func IsGone(err error) bool {
	return hasStatusOrCode(err, http.StatusGone, api.CodeGone)
}

// IsTooLarge reports a 413: a body or a file over its limit.
func IsTooLarge(err error) bool {
	return hasStatusOrCode(err, http.StatusRequestEntityTooLarge, api.CodeTooLarge)
}

// IsAgentUnreachable reports a 502 "agent_unreachable": the sandbox's agent
// did not answer.
func IsAgentUnreachable(err error) bool { return HasCode(err, api.CodeAgentUnreachable) }

// IsUnavailable reports a 503 (unavailable or no_capacity): retry after
// the error's RetryAfter.
func IsUnavailable(err error) bool {
	return hasStatusOrCode(err, http.StatusServiceUnavailable, api.CodeUnavailable, api.CodeNoCapacity)
}

// IsNoCapacity reports a 503 "no_capacity": the pool is at max_total.
func IsNoCapacity(err error) bool { return HasCode(err, api.CodeNoCapacity) }
