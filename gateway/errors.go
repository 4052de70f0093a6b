package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/quarryhq/quarry/envs"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/modelservice"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/warmpool"
)

// codeMethodNotAllowed is the gateway's code for 405 and
// codeUpstreamUnreachable for a model relay upstream that failed (502);
// every other code is one of agentapi's.
const (
	codeMethodNotAllowed    = "method_not_allowed"
	codeUpstreamUnreachable = "upstream_unreachable"
)

// errBodyTooLarge: a request body exceeded its limit (413).
var errBodyTooLarge = errors.New("request body too large")

// apiError is an answer the gateway decided itself.
type apiError struct {
	Status  int
	Code    string
	Message string
}

func (e *apiError) Error() string { return e.Message }

// unauthorized returns the 401 answer with msg.
func unauthorized(msg string) error {
	return &apiError{Status: http.StatusUnauthorized, Code: agentapi.CodeUnauthorized, Message: msg}
}

// sandboxError attaches the sandbox id to an error about it, so that the
// answer can name the sandbox.
type sandboxError struct {
	ID  string
	Err error
}

func (e *sandboxError) Error() string { return fmt.Sprintf("sandbox %s: %v", e.ID, e.Err) }
func (e *sandboxError) Unwrap() error { return e.Err }

// leaseGoneError: the sandbox's lease is no longer active (410).
type leaseGoneError struct {
	State  warmpool.LeaseState
	Reason string
}

func (e *leaseGoneError) Error() string { return fmt.Sprintf("lease %s: %s", e.State, e.Reason) }

// Is makes a leaseGoneError match warmpool.ErrLeaseEnded.
func (e *leaseGoneError) Is(target error) bool { return target == warmpool.ErrLeaseEnded }

// bodyReadError: reading the client's request body failed (the client went
// away or sent a malformed chunked body).
type bodyReadError struct{ Err error }

func (e *bodyReadError) Error() string { return fmt.Sprintf("read request body: %v", e.Err) }
func (e *bodyReadError) Unwrap() error { return e.Err }

// agentCallError: a call to the sandbox's agent got no usable answer.
type agentCallError struct {
	Err     error
	Timeout bool // the call's deadline passed
}

func (e *agentCallError) Error() string { return fmt.Sprintf("call agent: %v", e.Err) }
func (e *agentCallError) Unwrap() error { return e.Err }

// newAgentCallError classifies err from an agent call.
func newAgentCallError(err error) *agentCallError {
	var ne net.Error
	timeout := errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, fasthttp.ErrDialTimeout) ||
		errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
	return &agentCallError{Err: err, Timeout: timeout}
}

// agentDown reports whether a failed agent call suggests the task itself may
// be gone (so the manager should check it), as opposed to the gateway's own
// limits.
func (e *agentCallError) agentDown() bool {
	return !errors.Is(e.Err, fasthttp.ErrNoFreeConns) && !errors.Is(e.Err, fasthttp.ErrBodyTooLarge)
}

// answer is the HTTP answer of an error.
type answer struct {
	status  int
	code    string
	message string
	retry   bool // 503: send Retry-After
}

// describe is the one mapping from errors to HTTP answers.
func describe(err error) answer {
	subject := "the sandbox"
	var sbx *sandboxError
	if errors.As(err, &sbx) {
		subject = "sandbox " + sbx.ID
	}
	var (
		api   *apiError
		ve    *badinput.Error
		fe    *fiber.Error
		gone  *leaseGoneError
		ae    *agentapi.Error
		call  *agentCallError
		body  *bodyReadError
		launc *providers.LaunchError
	)
	if a, ok := describeModel(subject, err); ok {
		return a
	}
	if a, ok := describeEnv(subject, err); ok {
		return a
	}
	switch {
	case errors.As(err, &api):
		return answer{status: api.Status, code: api.Code, message: api.Message}
	case errors.As(err, &ve):
		return answer{status: http.StatusBadRequest, code: agentapi.CodeBadRequest, message: ve.Error()}
	case errors.Is(err, errBodyTooLarge):
		return answer{status: http.StatusRequestEntityTooLarge, code: agentapi.CodeTooLarge, message: err.Error()}
	case errors.As(err, &body):
		return answer{status: http.StatusBadRequest, code: agentapi.CodeBadRequest, message: "body: " + body.Err.Error()}
	case errors.As(err, &fe):
		return describeFiber(fe)
	case errors.As(err, &gone):
		return answer{status: http.StatusGone, code: agentapi.CodeGone, message: goneMessage(subject, gone)}
	case errors.As(err, &ae):
		return describeAgent(subject, ae)
	case errors.As(err, &call):
		return describeAgentCall(subject, call)
	case errors.Is(err, warmpool.ErrLeaseEnded):
		return answer{status: http.StatusGone, code: agentapi.CodeGone, message: subject + ": its lease has ended"}
	case errors.Is(err, warmpool.ErrNotFound), errors.Is(err, warmpool.ErrLeaseNotHeld):
		return answer{status: http.StatusNotFound, code: agentapi.CodeNotFound, message: subject + " not found"}
	case errors.Is(err, warmpool.ErrConflict):
		return answer{status: http.StatusConflict, code: agentapi.CodeConflict, message: subject + " changed concurrently; retry"}
	case errors.Is(err, warmpool.ErrNoCapacity), errors.Is(err, providers.ErrNoCapacity):
		return answer{status: http.StatusServiceUnavailable, code: agentapi.CodeNoCapacity, retry: true,
			message: "no sandbox available: the pool is at its max_total; retry later"}
	case errors.Is(err, warmpool.ErrUnavailable), errors.Is(err, warmpool.ErrClosed),
		errors.Is(err, providers.ErrThrottled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, context.Canceled):
		return answer{status: http.StatusServiceUnavailable, code: agentapi.CodeUnavailable, retry: true,
			message: "the lease store or provider is unavailable; retry later"}
	case errors.As(err, &launc):
		return answer{status: http.StatusInternalServerError, code: agentapi.CodeInternal, message: launc.Error()}
	default:
		return answer{status: http.StatusInternalServerError, code: agentapi.CodeInternal, message: "internal error"}
	}
}

// describeModel maps the model relay's errors (modelservice); ok is false
// for any other error.
func describeModel(subject string, err error) (answer, bool) {
	var (
		bad *badinput.Error
		up  *modelservice.UpstreamError
	)
	switch {
	case errors.As(err, &bad):
		return answer{status: http.StatusBadRequest, code: agentapi.CodeBadRequest, message: bad.Error()}, true
	case errors.Is(err, modelservice.ErrBadToken):
		return answer{status: http.StatusUnauthorized, code: agentapi.CodeUnauthorized,
			message: "invalid relay token: send this sandbox's $OPENAI_API_KEY"}, true
	case errors.Is(err, modelservice.ErrUpstreamNotAllowed):
		return answer{status: http.StatusForbidden, code: agentapi.CodeForbidden, message: err.Error()}, true
	case errors.As(err, &up):
		return answer{status: http.StatusBadGateway, code: codeUpstreamUnreachable,
			message: "the model upstream of " + subject + " failed: " + up.Err.Error()}, true
	case errors.Is(err, modelservice.ErrTimeout):
		return answer{status: http.StatusGatewayTimeout, code: agentapi.CodeTimeout,
			message: "no trainer answered the model request within its timeout"}, true
	case errors.Is(err, modelservice.ErrNotFound):
		return answer{status: http.StatusNotFound, code: agentapi.CodeNotFound, message: "model request not found"}, true
	case errors.Is(err, modelservice.ErrAnswered):
		return answer{status: http.StatusConflict, code: agentapi.CodeConflict, message: "the model request was answered already"}, true
	case errors.Is(err, modelservice.ErrConflict):
		return answer{status: http.StatusConflict, code: agentapi.CodeConflict, message: err.Error()}, true
	case errors.Is(err, modelservice.ErrGone):
		return answer{status: http.StatusGone, code: agentapi.CodeGone,
			message: "the model request is gone: its agent disconnected or it timed out"}, true
	case errors.Is(err, modelservice.ErrShuttingDown):
		return answer{status: http.StatusServiceUnavailable, code: agentapi.CodeUnavailable, retry: true,
			message: modelservice.ErrShuttingDown.Error()}, true
	case errors.Is(err, modelservice.ErrFull), errors.Is(err, modelservice.ErrUnavailable), errors.Is(err, modelservice.ErrClosed):
		return answer{status: http.StatusServiceUnavailable, code: agentapi.CodeUnavailable, retry: true,
			message: "the model relay is unavailable (" + err.Error() + "); retry later"}, true
	}
	return answer{}, false
}

// describeEnv maps the env API's errors (envs); ok is false for any other
// error.
func describeEnv(subject string, err error) (answer, bool) {
	var (
		bad *badinput.Error
		ee  *envs.Error
	)
	switch {
	case errors.Is(err, errEnvsOff):
		return answer{status: http.StatusNotFound, code: agentapi.CodeNotFound, message: err.Error()}, true
	case errors.As(err, &bad):
		return answer{status: http.StatusBadRequest, code: agentapi.CodeBadRequest, message: bad.Error()}, true
	case errors.Is(err, envs.ErrNotEnv):
		msg := err.Error()
		if sbx := (*sandboxError)(nil); errors.As(err, &sbx) {
			msg = sbx.Err.Error()
		}
		return answer{status: http.StatusConflict, code: agentapi.CodeConflict, message: msg}, true
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
		return answer{status: status, code: string(ee.Kind), message: subject + ": " + ee.Message}, true
	}
	return answer{}, false
}

// goneMessage says which way a lease ended.
func goneMessage(subject string, g *leaseGoneError) string {
	var msg string
	switch g.State {
	case warmpool.LeaseReleased:
		msg = subject + " was released"
	case warmpool.LeaseExpired:
		msg = subject + " expired: its lease was not renewed before expires_at"
	case warmpool.LeaseLost:
		msg = subject + " was lost"
	default:
		msg = subject + ": its lease has ended"
	}
	if g.Reason != "" {
		msg += " (" + g.Reason + ")"
	}
	return msg
}

func describeFiber(fe *fiber.Error) answer {
	code := agentapi.CodeInternal
	switch {
	case fe.Code == http.StatusNotFound:
		code = agentapi.CodeNotFound
	case fe.Code == http.StatusMethodNotAllowed:
		code = codeMethodNotAllowed
	case fe.Code == http.StatusRequestEntityTooLarge:
		code = agentapi.CodeTooLarge
	case fe.Code == http.StatusRequestTimeout:
		code = agentapi.CodeTimeout
	case fe.Code >= 400 && fe.Code < 500:
		code = agentapi.CodeBadRequest
	}
	return answer{status: fe.Code, code: code, message: fe.Message}
}

// describeAgent maps an agent's own error answer that the gateway does not
// pass through unchanged.
func describeAgent(subject string, ae *agentapi.Error) answer {
	switch {
	case ae.Code == agentapi.CodeStaleGeneration:
		return answer{status: http.StatusGone, code: agentapi.CodeGone,
			message: subject + ": its lease has ended (the sandbox belongs to a newer lease)"}
	case ae.Status == http.StatusUnauthorized:
		// Only a 401 means the gateway's token was refused; a 403 is the
		// sandbox's own answer (e.g. a path it may not read) and passes on.
		return answer{status: http.StatusBadGateway, code: agentapi.CodeAgentUnreachable,
			message: "the agent of " + subject + " refused the gateway's credentials"}
	case ae.Status >= 400 && ae.Status < 500:
		return answer{status: ae.Status, code: ae.Code, message: ae.Message}
	default:
		return answer{status: http.StatusBadGateway, code: agentapi.CodeAgentUnreachable,
			message: "the agent of " + subject + " failed: " + ae.Message}
	}
}

func describeAgentCall(subject string, e *agentCallError) answer {
	switch {
	case errors.Is(e.Err, fasthttp.ErrNoFreeConns):
		return answer{status: http.StatusServiceUnavailable, code: agentapi.CodeUnavailable, retry: true,
			message: "too many concurrent calls to the agent of " + subject + "; retry later"}
	case errors.Is(e.Err, fasthttp.ErrBodyTooLarge):
		return answer{status: http.StatusBadGateway, code: agentapi.CodeAgentUnreachable,
			message: "the agent of " + subject + " answered with a body over the gateway's limit (QUARRY_MAX_AGENT_RESPONSE)"}
	case e.Timeout:
		return answer{status: http.StatusGatewayTimeout, code: agentapi.CodeTimeout,
			message: "the agent of " + subject + " did not answer in time"}
	default:
		return answer{status: http.StatusBadGateway, code: agentapi.CodeAgentUnreachable,
			message: "the agent of " + subject + " is unreachable: " + e.Err.Error()}
	}
}

// writeError answers c with err in the one JSON error shape and logs server
// side failures. It replaces whatever answer c had.
func (g *Gateway) writeError(c *fiber.Ctx, err error) {
	a := describe(err)
	switch {
	case a.status >= 500 && a.code == agentapi.CodeInternal:
		g.log.Error("request failed", "method", c.Method(), "path", c.Path(), "status", a.status, "err", err)
	case a.status >= 500:
		g.log.Warn("request failed", "method", c.Method(), "path", c.Path(), "status", a.status, "err", err)
	default:
		g.log.Debug("request refused", "method", c.Method(), "path", c.Path(), "status", a.status, "err", err)
	}
	resp := c.Response()
	resp.Reset()
	if a.retry {
		secs := int(g.cfg.RetryAfter.Seconds())
		if secs < 1 {
			secs = 1
		}
		resp.Header.Set(fiber.HeaderRetryAfter, strconv.Itoa(secs))
	}
	if err := c.Status(a.status).JSON(agentapi.ErrorBody{Error: agentapi.ErrorDetail{Code: a.code, Message: a.message}}); err != nil {
		g.log.Error("write error answer", "err", err)
	}
}

// errorHandler is fiber's ErrorHandler: errors that escape the middleware
// chain (there should be none) get the same shape.
func (g *Gateway) errorHandler(c *fiber.Ctx, err error) error {
	g.writeError(c, err)
	return nil
}
