package rockcompat

import (
	"bytes"
	"net/http"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/internal/badinput"
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
// "Failed" one rendered from its classification (failureOf).
func (s *Service) handle(name string, fn handlerFunc) fiber.Handler {
	return func(c *fiber.Ctx) error {
		res, err := fn(c, s.owner(c))
		if err != nil {
			f := failureOf(err)
			if f.Status >= 500 {
				s.log.Warn("rock call failed", "route", name, "err", err)
			}
			status := http.StatusOK
			if name == "read_file" {
				// The SDK's read_file reads result["content"] whatever the
				// status says: only an HTTP error stops it cleanly.
				status = f.Status
			}
			if f.Retryable {
				c.Set(fiber.HeaderRetryAfter, errclass.RetryAfter(s.cfg.RetryAfter))
			}
			return WriteFailed(c, status, name+" failed", f.code, f.Message)
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

// failure is an error's classification with its ROCK result code.
type failure struct {
	errclass.Class
	code int
}

// failureOf classifies err (errclass.Of) and gives it ROCK's result code:
// 6000 for a command that failed, 5000 — the code ROCK's SDK documents as
// the one to retry — for what a retry can fix and for the service's own
// failures, 4000 for the caller's. A retryable failure's message says
// "retry"; the handlers also send Retry-After with it.
func failureOf(err error) failure {
	c := errclass.Of(err)
	code := codeBadRequest
	switch {
	case c.Code == api.CodeCommandFailed:
		code = codeCommand
	case c.Retryable || c.Status >= 500:
		code = codeInternal
	}
	return failure{Class: c, code: code}
}

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

// safePath reports whether p is made of letters, digits, '.', '_', '-' and
// '/' only: a path that needs no shell quoting.
func safePath(p string) bool {
	if p == "" {
		return false
	}
	for i := 0; i < len(p); i++ {
		b := p[i]
		if !badinput.Alnum(b) && !strings.ContainsRune("._-/", rune(b)) {
			return false
		}
	}
	return true
}
