package rockcompat

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/warmpool"
)

// ROCK's result codes (rock._codes): 2xxx ok, 4xxx the caller's fault,
// 5xxx the service's, 6xxx the command's. The SDK's start and delete turn
// them into BadRequestRockError, InternalServerRockError, CommandRockError.
const (
	codeBadRequest = 4000
	codeInternal   = 5000
	codeCommand    = 6000
)

// envelope is ROCK's response shape: {"status", "message", "error", "result"}.
type envelope struct {
	Status  string  `json:"status"`
	Message *string `json:"message"`
	Error   *string `json:"error"`
	Result  any     `json:"result"`
}

// failedResult is the result of a failed call, ROCK's SandboxResponse.
type failedResult struct {
	Code          int    `json:"code"`
	FailureReason string `json:"failure_reason"`
}

// handlerFunc serves one route for an authenticated owner and returns the
// result of a successful call.
type handlerFunc func(c *fiber.Ctx, owner string) (any, error)

// handle wraps fn: a result becomes a "Success" envelope, an error a
// "Failed" one (describe).
func (s *Service) handle(name string, fn handlerFunc) fiber.Handler {
	return func(c *fiber.Ctx) error {
		res, err := fn(c, s.owner(c))
		if err != nil {
			f := describe(err)
			if f.code == codeInternal {
				s.log.Warn("rock call failed", "route", name, "err", err)
			}
			status := http.StatusOK
			if name == "read_file" {
				// The SDK's read_file reads result["content"] whatever the
				// status says: only an HTTP error stops it cleanly.
				status = f.httpStatus
			}
			return WriteFailed(c, status, name+" failed", f.code, f.message)
		}
		return c.JSON(envelope{Status: "Success", Result: res})
	}
}

// WriteFailed answers c with ROCK's "Failed" envelope: message names the
// operation, errMsg says what went wrong, code is a ROCK result code (4000
// for the caller's fault, 5000 for the service's). It never fails for a
// valid status.
func WriteFailed(c *fiber.Ctx, status int, message string, code int, errMsg string) error {
	return c.Status(status).JSON(envelope{Status: "Failed", Message: &message, Error: &errMsg,
		Result: failedResult{Code: code, FailureReason: errMsg}})
}

// failure is how one error is answered.
type failure struct {
	code       int
	httpStatus int
	message    string
}

// Errors the package decides itself.
var (
	// errGone: the sandbox's lease has ended.
	errGone = errors.New("sandbox is no longer running")
)

// sandboxErr names the sandbox an error is about.
type sandboxErr struct {
	id  string
	err error
}

func (e *sandboxErr) Error() string { return fmt.Sprintf("sandbox %s: %v", e.id, e.err) }
func (e *sandboxErr) Unwrap() error { return e.err }

// commandError: a command ran and failed (check "raise", a timeout, a
// closed shell).
type commandError struct{ msg string }

func (e *commandError) Error() string { return e.msg }

// describe is the one mapping from errors to ROCK answers.
func describe(err error) failure {
	subject := "the sandbox"
	var sbx *sandboxErr
	if errors.As(err, &sbx) {
		subject = "sandbox " + sbx.id
	}
	var (
		ve  *badinput.Error
		ce  *commandError
		ae  *agentapi.Error
		ne  net.Error
		bad = func(msg string) failure {
			return failure{code: codeBadRequest, httpStatus: http.StatusBadRequest, message: msg}
		}
	)
	switch {
	case errors.As(err, &ve):
		return bad(ve.Error())
	case errors.As(err, &ce):
		return failure{code: codeCommand, httpStatus: http.StatusUnprocessableEntity, message: ce.msg}
	case errors.Is(err, errGone), errors.Is(err, warmpool.ErrLeaseEnded):
		return failure{code: codeBadRequest, httpStatus: http.StatusGone, message: err.Error()}
	case errors.Is(err, warmpool.ErrNotFound), errors.Is(err, warmpool.ErrLeaseNotHeld):
		return failure{code: codeBadRequest, httpStatus: http.StatusNotFound, message: subject + " not found"}
	case errors.As(err, &ae):
		return describeAgent(subject, ae)
	case errors.Is(err, warmpool.ErrNoCapacity):
		return failure{code: codeInternal, httpStatus: http.StatusServiceUnavailable,
			message: "no sandbox available: the pool is at its max_total; retry later"}
	case errors.Is(err, warmpool.ErrConflict):
		return failure{code: codeInternal, httpStatus: http.StatusConflict, message: subject + " changed concurrently; retry"}
	case errors.Is(err, warmpool.ErrUnavailable), errors.Is(err, warmpool.ErrClosed),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return failure{code: codeInternal, httpStatus: http.StatusServiceUnavailable,
			message: "the lease store or the sandbox did not answer in time; retry later"}
	case errors.As(err, &ne):
		return failure{code: codeInternal, httpStatus: http.StatusBadGateway,
			message: "the agent of " + subject + " is unreachable: " + ne.Error()}
	default:
		return failure{code: codeInternal, httpStatus: http.StatusInternalServerError, message: "internal error: " + err.Error()}
	}
}

// describeAgent maps an agent's error answer.
func describeAgent(subject string, ae *agentapi.Error) failure {
	switch {
	case ae.Code == agentapi.CodeStaleGeneration:
		return failure{code: codeBadRequest, httpStatus: http.StatusGone,
			message: subject + " is no longer running (its lease has ended)"}
	case ae.Status == http.StatusUnauthorized || ae.Status == http.StatusForbidden:
		return failure{code: codeInternal, httpStatus: http.StatusBadGateway,
			message: "the agent of " + subject + " refused the gateway's credentials"}
	case ae.Status >= 400 && ae.Status < 500:
		return failure{code: codeBadRequest, httpStatus: ae.Status, message: ae.Message}
	default:
		return failure{code: codeInternal, httpStatus: http.StatusBadGateway,
			message: "the agent of " + subject + " failed: " + ae.Message}
	}
}

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

// printable reports whether s is printable ASCII (spaces allowed).
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// safePath reports whether p is made of letters, digits, '.', '_', '-' and
// '/' only: a path that needs no shell quoting.
func safePath(p string) bool {
	if p == "" {
		return false
	}
	for i := 0; i < len(p); i++ {
		b := p[i]
		if !isAlnum(b) && !strings.ContainsRune("._-/", rune(b)) {
			return false
		}
	}
	return true
}

func isAlnum(b byte) bool {
	return (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9')
}
