package errclass

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/envs"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/modelservice"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/warmpool"
)

// Class is how every API surface answers one error.
type Class struct {
	// Code is the machine-readable code: an api.Code* or one of the
	// Code* constants above (an env program's failure carries its
	// envs.Kind).
	Code string
	// Status is the HTTP status on Quarry's own API.
	Status int
	// Retryable: the same request can succeed if it is sent again later;
	// nothing about it is wrong. Quarry's API sends Retry-After with a
	// retryable 503; ROCK's envelope answers code 5000, which ROCK's SDK
	// documents as the one to retry.
	Retryable bool
	// Message is for people: what went wrong and, where it helps, what to
	// do. It never carries the details of an unexpected error.
	Message string
}

// Unexpected reports whether the class is an unexpected server failure
// (code internal), which surfaces log at error level.
func (c Class) Unexpected() bool { return c.Code == api.CodeInternal }

// SandboxError names the sandbox an error is about, so that its message
// can say which.
type SandboxError struct {
	ID  string
	Err error
}

// Sandbox returns err wrapped in a *SandboxError naming sandbox id; nil for
// a nil err.
func Sandbox(id string, err error) error {
	if err == nil {
		return nil
	}
	return &SandboxError{ID: id, Err: err}
}

func (e *SandboxError) Error() string { return fmt.Sprintf("sandbox %s: %v", e.ID, e.Err) }
func (e *SandboxError) Unwrap() error { return e.Err }

// Error is an error whose class its maker decided: an authentication
// failure, a route that is switched off.
type Error struct{ Class }

func (e *Error) Error() string { return e.Message }

// New returns an *Error of the class (code, status, message).
func New(status int, code, message string) error {
	return &Error{Class{Code: code, Status: status, Message: message}}
}

// Unauthorized returns the 401 answer with message.
func Unauthorized(message string) error {
	return New(http.StatusUnauthorized, api.CodeUnauthorized, message)
}

// RetryAfter is the Retry-After header value (whole seconds, at least 1)
// that surfaces send with a retryable answer, for the configured delay d.
func RetryAfter(d time.Duration) string { return strconv.Itoa(max(1, int(d.Seconds()))) }

// ErrTooLarge: a request body exceeded its limit (413). Wrap it with the
// limit: fmt.Errorf("body: larger than %d bytes: %w", n, ErrTooLarge).
var ErrTooLarge = errors.New("request body too large")

// BodyReadError: reading the client's request body failed (the client went
// away or sent a malformed chunked body); 400.
type BodyReadError struct{ Err error }

func (e *BodyReadError) Error() string { return fmt.Sprintf("read request body: %v", e.Err) }
func (e *BodyReadError) Unwrap() error { return e.Err }

// StatusError is an answer the HTTP stack decided by its status alone: a
// router's 404 or 405, a server's 408 or 413. A surface translates its
// framework's own errors into it (gateway/errors.go, fiber's), so that
// this package knows no framework; Of gives it the code of its status.
// Err is the framework's error, kept for logs and errors.As.
type StatusError struct {
	Status  int
	Message string
	Err     error
}

func (e *StatusError) Error() string { return e.Message }
func (e *StatusError) Unwrap() error { return e.Err }

// CommandError: a command ran and failed where the caller asked for that
// to be an error (api.CodeCommandFailed, 422). Message says how it failed and
// carries its output.
type CommandError struct{ Message string }

func (e *CommandError) Error() string { return e.Message }

// Of classifies err. It is the one mapping from Quarry's errors (the
// contracts' sentinels and typed errors, wrapped or not) to what clients
// are told; every surface renders its result. An error it does not know is
// internal, and its text is not shown. A Message never ends in white space:
// one made of a command's output or a program's own message (a traceback)
// would end in a newline.
func Of(err error) Class {
	c := of(err)
	c.Message = strings.TrimRightFunc(c.Message, unicode.IsSpace)
	return c
}

func of(err error) Class {
	subject, killAll := "the sandbox", "kill-all"
	var sbx *SandboxError
	if errors.As(err, &sbx) {
		subject, killAll = "sandbox "+sbx.ID, "POST /v1/sandboxes/"+sbx.ID+"/kill-all"
	}
	if c, ok := ofRequest(err); ok {
		return c
	}
	if c, ok := ofCheckpoint(err); ok {
		return c
	}
	if c, ok := ofModel(subject, err); ok {
		return c
	}
	if c, ok := ofEnv(subject, err); ok {
		return c
	}
	if c, ok := ofAgent(subject, killAll, err); ok {
		return c
	}
	return ofLease(subject, err)
}

// ofRequest classifies the caller's own mistakes and the classes decided
// where the error was made.
func ofRequest(err error) (Class, bool) {
	var (
		fixed *Error
		bad   *badinput.Error
		body  *BodyReadError
		cmd   *CommandError
		se    *StatusError
	)
	switch {
	case errors.As(err, &fixed):
		return fixed.Class, true
	case errors.As(err, &bad):
		return Class{Code: api.CodeBadRequest, Status: http.StatusBadRequest, Message: bad.Error()}, true
	case errors.Is(err, ErrTooLarge):
		return Class{Code: api.CodeTooLarge, Status: http.StatusRequestEntityTooLarge, Message: err.Error()}, true
	case errors.As(err, &body):
		return Class{Code: api.CodeBadRequest, Status: http.StatusBadRequest, Message: "body: " + body.Err.Error()}, true
	case errors.As(err, &cmd):
		return Class{Code: api.CodeCommandFailed, Status: http.StatusUnprocessableEntity, Message: cmd.Message}, true
	case errors.As(err, &se):
		return ofStatus(se), true
	}
	return Class{}, false
}

func ofStatus(se *StatusError) Class {
	code := api.CodeInternal
	switch {
	case se.Status == http.StatusNotFound:
		code = api.CodeNotFound
	case se.Status == http.StatusMethodNotAllowed:
		code = api.CodeMethodNotAllowed
	case se.Status == http.StatusRequestEntityTooLarge:
		code = api.CodeTooLarge
	case se.Status == http.StatusRequestTimeout:
		code = api.CodeTimeout
	case se.Status >= 400 && se.Status < 500:
		code = api.CodeBadRequest
	}
	return Class{Code: code, Status: se.Status, Message: se.Message}
}

// ofCheckpoint classifies the checkpoint store's errors (checkpoints). It
// runs before the agent's classes: a restore that streams a corrupt
// archive into an agent fails as a call to the agent whose cause is the
// corruption.
func ofCheckpoint(err error) (Class, bool) {
	var budget *checkpoints.BudgetError
	switch {
	case errors.As(err, &budget):
		return Class{Code: api.CodeQuotaExceeded, Status: http.StatusTooManyRequests, Message: budgetMessage(budget)}, true
	case errors.Is(err, checkpoints.ErrNotFound):
		return Class{Code: api.CodeNotFound, Status: http.StatusNotFound, Message: "checkpoint not found"}, true
	case errors.Is(err, checkpoints.ErrTooLarge):
		return Class{Code: api.CodeTooLarge, Status: http.StatusRequestEntityTooLarge,
			Message: err.Error() + " (QUARRY_MAX_CHECKPOINT_BYTES): take a checkpoint of fewer paths, or exclude some"}, true
	case errors.Is(err, checkpoints.ErrCorrupt):
		return Class{Code: api.CodeCheckpointCorrupt, Status: http.StatusInternalServerError,
			Message: "the checkpoint's stored archive is damaged (its bytes do not match its sha256 or size) and was refused; take a new checkpoint"}, true
	case errors.Is(err, checkpoints.ErrExists):
		return Class{Code: api.CodeConflict, Status: http.StatusConflict, Retryable: true,
			Message: "the checkpoint id is taken; retry"}, true
	case errors.Is(err, checkpoints.ErrUnavailable), errors.Is(err, checkpoints.ErrClosed):
		return Class{Code: api.CodeUnavailable, Status: http.StatusServiceUnavailable, Retryable: true,
			Message: "the checkpoint store is unavailable; retry later"}, true
	}
	return Class{}, false
}

// budgetMessage says which budget a checkpoint passed, by how much, what
// sets it and what frees it.
func budgetMessage(e *checkpoints.BudgetError) string {
	whose := "this API key's checkpoints"
	if e.Scope == checkpoints.ScopeTotal {
		whose = "the gateway's checkpoints, all API keys together,"
	}
	need := "it"
	switch {
	case e.AtLeast && e.Need == 0:
		need = "anything more"
	case e.AtLeast:
		need = "an archive over " + byteSize(e.Need-1)
	case e.Need > 0:
		need = "this " + byteSize(e.Need) + " archive"
	}
	return fmt.Sprintf("checkpoint budget spent: %s take %s of the %s allowed (%s=%d), with no room for %s; nothing was kept. "+
		"Delete checkpoints (expired ones are freed by the next purge), checkpoint fewer paths or exclude some, "+
		"or ask for a higher %s", whose, byteSize(e.Used), byteSize(e.Limit), e.Variable(), e.Limit, need, e.Variable())
}

// byteSize is n in binary units, for people ("1.5 GiB", "512 B").
func byteSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n)/unit, 0
	for ; v >= unit && i < 5; i++ {
		v /= unit
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTPE"[i])
}

// ofModel classifies the model relay's errors (modelservice).
func ofModel(subject string, err error) (Class, bool) {
	var up *modelservice.UpstreamError
	switch {
	case errors.Is(err, modelservice.ErrBadToken):
		return Class{Code: api.CodeUnauthorized, Status: http.StatusUnauthorized,
			Message: "invalid relay token: send this sandbox's $OPENAI_API_KEY"}, true
	case errors.Is(err, modelservice.ErrUpstreamNotAllowed):
		return Class{Code: api.CodeForbidden, Status: http.StatusForbidden, Message: err.Error()}, true
	case errors.As(err, &up):
		return Class{Code: api.CodeUpstreamUnreachable, Status: http.StatusBadGateway,
			Message: "the model upstream of " + subject + " failed: " + up.Err.Error()}, true
	case errors.Is(err, modelservice.ErrTimeout):
		return Class{Code: api.CodeTimeout, Status: http.StatusGatewayTimeout,
			Message: "no trainer answered the model request within its timeout"}, true
	case errors.Is(err, modelservice.ErrNotFound):
		return Class{Code: api.CodeNotFound, Status: http.StatusNotFound, Message: "model request not found"}, true
	case errors.Is(err, modelservice.ErrAnswered):
		return Class{Code: api.CodeConflict, Status: http.StatusConflict, Message: "the model request was answered already"}, true
	case errors.Is(err, modelservice.ErrConflict):
		return Class{Code: api.CodeConflict, Status: http.StatusConflict, Message: err.Error()}, true
	case errors.Is(err, modelservice.ErrGone):
		return Class{Code: api.CodeGone, Status: http.StatusGone,
			Message: "the model request is gone: its agent disconnected or it timed out"}, true
	case errors.Is(err, modelservice.ErrShuttingDown):
		return Class{Code: api.CodeUnavailable, Status: http.StatusServiceUnavailable, Retryable: true,
			Message: modelservice.ErrShuttingDown.Error()}, true
	case errors.Is(err, modelservice.ErrFull), errors.Is(err, modelservice.ErrUnavailable), errors.Is(err, modelservice.ErrClosed):
		return Class{Code: api.CodeUnavailable, Status: http.StatusServiceUnavailable, Retryable: true,
			Message: "the model relay is unavailable (" + err.Error() + "); retry later"}, true
	}
	return Class{}, false
}

// ofEnv classifies the env API's errors (envs).
func ofEnv(subject string, err error) (Class, bool) {
	var ee *envs.Error
	switch {
	case errors.Is(err, envs.ErrOff):
		return Class{Code: api.CodeNotFound, Status: http.StatusNotFound, Message: envs.ErrOff.Error()}, true
	case errors.Is(err, envs.ErrNotEnv):
		msg := err.Error()
		if sbx := (*SandboxError)(nil); errors.As(err, &sbx) {
			msg = sbx.Err.Error()
		}
		return Class{Code: api.CodeConflict, Status: http.StatusConflict, Message: msg}, true
	case errors.As(err, &ee):
		status := http.StatusBadGateway
		switch ee.Kind {
		case envs.KindInvalidAction:
			status = http.StatusBadRequest
		case envs.KindNotRunning:
			status = http.StatusConflict
		case envs.KindTimeout:
			status = http.StatusGatewayTimeout
		}
		return Class{Code: string(ee.Kind), Status: status, Message: subject + ": " + ee.Message}, true
	}
	return Class{}, false
}

// ofAgent classifies a sandbox agent's own error answers and calls to it
// that got no usable answer. killAll is how to call the sandbox's kill-all.
func ofAgent(subject, killAll string, err error) (Class, bool) {
	var (
		ae *agentapi.Error
		ce *agentapi.CallError
	)
	switch {
	case errors.As(err, &ae):
		return ofAgentAnswer(subject, killAll, ae), true
	case errors.As(err, &ce):
		return ofAgentCall(subject, ce), true
	}
	return Class{}, false
}

func ofAgentAnswer(subject, killAll string, ae *agentapi.Error) Class {
	switch {
	case ae.Code == agentapi.CodeStaleGeneration:
		return Class{Code: api.CodeGone, Status: http.StatusGone,
			Message: subject + ": its lease has ended (the sandbox belongs to a newer lease)"}
	case ae.Status == http.StatusUnauthorized:
		// Only a 401 means the gateway's token was refused; a 403 is the
		// sandbox's own answer (e.g. a path it may not read) and passes on.
		return Class{Code: api.CodeAgentUnreachable, Status: http.StatusBadGateway,
			Message: "the agent of " + subject + " refused the gateway's credentials"}
	case ae.Status >= 400 && ae.Status < 500:
		return Class{Code: ae.Code, Status: ae.Status, Message: ae.Message}
	case ae.Code == api.CodePortClosed:
		// Nothing listens on a sandbox port the caller named (the agent is
		// fine): 502 with the agent's message naming the port.
		return Class{Code: api.CodePortClosed, Status: http.StatusBadGateway, Message: ae.Message}
	case ae.Code == api.CodeInsufficientStorage:
		// The sandbox's disk is full: its own state, which the caller can
		// change (delete files, a larger disk); the agent is fine.
		return Class{Code: api.CodeInsufficientStorage, Status: http.StatusInsufficientStorage, Message: subject + ": " + ae.Message}
	case ae.Code == api.CodePidsLimit:
		// The sandbox is at its limit of processes (a fork bomb, a burst
		// of commands): nothing started, and a retry starts it once some
		// have exited; kill-all ends them all. The agent's message names
		// the limit.
		return Class{Code: api.CodePidsLimit, Status: http.StatusServiceUnavailable, Retryable: true,
			Message: ae.Message + " (" + killAll + ")"}
	default:
		return Class{Code: api.CodeAgentUnreachable, Status: http.StatusBadGateway,
			Message: "the agent of " + subject + " failed: " + ae.Message}
	}
}

// ofLease classifies the lease store's and the providers' errors, and the
// rest.
func ofLease(subject string, err error) Class {
	var (
		ended  *warmpool.LeaseEndedError
		launch *providers.LaunchError
		img    *providers.ImageError
		build  *providers.BuildError
		denied *warmpool.ImageNotAllowedError
		paused *warmpool.PauseStateError
	)
	switch {
	case errors.As(err, &ended):
		return Class{Code: api.CodeGone, Status: http.StatusGone, Message: endedMessage(subject, ended)}
	case errors.Is(err, warmpool.ErrLeaseEnded):
		return Class{Code: api.CodeGone, Status: http.StatusGone, Message: subject + ": its lease has ended"}
	case errors.Is(err, warmpool.ErrNotFound), errors.Is(err, warmpool.ErrLeaseNotHeld):
		return Class{Code: api.CodeNotFound, Status: http.StatusNotFound, Message: subject + " not found"}
	case errors.Is(err, warmpool.ErrIdempotencyMismatch):
		return Class{Code: api.CodeConflict, Status: http.StatusConflict,
			Message: "Idempotency-Key: it was first used with a different request (pool, lease_seconds, env or labels); a key makes one sandbox: use a new key"}
	case errors.As(err, &paused) && paused.Paused:
		return Class{Code: api.CodeConflict, Status: http.StatusConflict, Message: subject + " is paused already"}
	case errors.As(err, &paused):
		return Class{Code: api.CodeConflict, Status: http.StatusConflict, Message: subject + " is not paused"}
	case errors.Is(err, warmpool.ErrConflict):
		return Class{Code: api.CodeConflict, Status: http.StatusConflict, Retryable: true,
			Message: subject + " changed concurrently; retry"}
	case errors.As(err, &img):
		return ofImage(img)
	case errors.As(err, &denied):
		return Class{Code: api.CodeImageNotAllowed, Status: http.StatusForbidden, Message: denied.Error()}
	case errors.Is(err, warmpool.ErrNoCapacity), errors.Is(err, providers.ErrNoCapacity):
		return Class{Code: api.CodeNoCapacity, Status: http.StatusServiceUnavailable, Retryable: true,
			Message: "no sandbox available: the pool is at its max_total; retry later"}
	case errors.Is(err, warmpool.ErrUnavailable), errors.Is(err, warmpool.ErrClosed),
		errors.Is(err, providers.ErrThrottled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, context.Canceled):
		return Class{Code: api.CodeUnavailable, Status: http.StatusServiceUnavailable, Retryable: true,
			Message: "the lease store or provider is unavailable; retry later"}
	case errors.As(err, &build):
		return Class{Code: api.CodeBuildFailed, Status: http.StatusUnprocessableEntity, Message: build.Error()}
	case errors.As(err, &launch):
		return Class{Code: api.CodeInternal, Status: http.StatusInternalServerError, Message: launch.Error()}
	default:
		return Class{Code: api.CodeInternal, Status: http.StatusInternalServerError, Message: "internal error"}
	}
}

// endedMessage says which way a lease ended.
func endedMessage(subject string, e *warmpool.LeaseEndedError) string {
	var msg string
	switch e.State {
	case warmpool.LeaseReleased:
		msg = subject + " was released"
	case warmpool.LeaseExpired:
		msg = subject + " expired"
		if e.Reason == "" {
			msg += ": " + warmpool.ReasonNotRenewed
		}
	case warmpool.LeaseLost:
		msg = subject + " was lost"
	default:
		msg = subject + ": its lease has ended"
	}
	if e.Reason != "" {
		msg += " (" + e.Reason + ")"
	}
	return msg
}

// ofImage classifies an image that could not be prepared: its message
// names the image, the registry and the registry's answer.
func ofImage(e *providers.ImageError) Class {
	switch e.Kind {
	case providers.ImageNotFound:
		return Class{Code: api.CodeImageNotFound, Status: http.StatusNotFound, Message: e.Error()}
	case providers.ImageDenied:
		return Class{Code: api.CodeImageDenied, Status: http.StatusForbidden, Message: e.Error()}
	case providers.ImageUnreachable:
		return Class{Code: api.CodeRegistryUnavailable, Status: http.StatusServiceUnavailable, Retryable: true, Message: e.Error() + "; retry later"}
	default:
		return Class{Code: api.CodeBadRequest, Status: http.StatusBadRequest, Message: e.Error()}
	}
}
