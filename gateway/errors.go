package gateway

import (
	"errors"
	"net/http"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/e2bcompat"
	"github.com/quarryhq/quarry/errclass"
)

// writeError answers c with err in Quarry's one JSON error shape
// (api.ErrorBody), rendered from its classification (errclass.Of, after
// fromFiber), and logs server side failures. It replaces whatever answer c
// had. A retryable 503 carries Retry-After.
func (g *Gateway) writeError(c *fiber.Ctx, err error) { g.writeErrorBody(c, err, false) }

// foreignErrorBody is Quarry's error shape with E2B's Error body at the top
// level ({"code": 404, "message": "...", "error_code": "..."}), which
// E2B's SDK reads.
type foreignErrorBody struct {
	api.ErrorBody
	e2bcompat.Error
}

// writeForeignError is writeError for a call that is none of Quarry's (an
// unknown path outside /v1, notMatched): the body is a foreignErrorBody, so
// that a client of another API can show the message.
func (g *Gateway) writeForeignError(c *fiber.Ctx, err error) { g.writeErrorBody(c, err, true) }

func (g *Gateway) writeErrorBody(c *fiber.Ctx, err error, foreign bool) {
	a := errclass.Of(fromFiber(err))
	g.logFailure(c, a, err)
	resp := c.Response()
	resp.Reset()
	if a.Retryable && a.Status == http.StatusServiceUnavailable {
		resp.Header.Set(fiber.HeaderRetryAfter, errclass.RetryAfter(g.cfg.RetryAfter))
	}
	eb := api.ErrorBody{Error: api.ErrorDetail{Code: a.Code, Message: a.Message}}
	var body any = eb
	if foreign {
		body = foreignErrorBody{ErrorBody: eb, Error: e2bcompat.Error{Code: a.Status, ErrorCode: a.Code, Message: a.Message}}
	}
	if err := c.Status(a.Status).JSON(body); err != nil {
		g.log.Error("write error answer", "err", err)
	}
}

// writeE2BError answers a call to E2B's control plane with err in E2B's
// Error body (e2bcompat.WriteError), rendered from its classification.
func (g *Gateway) writeE2BError(c *fiber.Ctx, err error) {
	g.logFailure(c, e2bcompat.WriteError(c, fromFiber(err), g.cfg.RetryAfter), err)
}

// writeProxyError answers a call to E2B's data plane that the gateway
// refused with err, as E2B's proxy and envd answer (e2bcompat.WriteProxyError).
func (g *Gateway) writeProxyError(c *fiber.Ctx, err error) {
	g.logFailure(c, e2bcompat.WriteProxyError(c, fromFiber(err), g.cfg.RetryAfter), err)
}

// logFailure logs a request's error by its class: unexpected server
// failures at error level, other 5xx at warning level, refusals at debug.
func (g *Gateway) logFailure(c *fiber.Ctx, a errclass.Class, err error) {
	switch {
	case a.Status >= 500 && a.Unexpected():
		g.log.Error("request failed", "method", c.Method(), "path", c.Path(), "status", a.Status, "err", err)
	case a.Status >= 500:
		g.log.Warn("request failed", "method", c.Method(), "path", c.Path(), "status", a.Status, "err", err)
	default:
		g.log.Debug("request refused", "method", c.Method(), "path", c.Path(), "status", a.Status, "err", err)
	}
}

// fromFiber translates fiber's own errors — its router's 404 and 405 (and
// notMatched's), its server's 408 and 413 — into errclass.StatusError, the
// classifier's, which knows no framework; other errors pass unchanged.
// fiber's errors reach the gateway's answers only here (writeError and
// errorHandler).
func fromFiber(err error) error {
	var fe *fiber.Error
	if !errors.As(err, &fe) {
		return err
	}
	return &errclass.StatusError{Status: fe.Code, Message: fe.Message, Err: err}
}

// errorHandler is fiber's ErrorHandler: errors that escape the middleware
// chain (there should be none) get the same shape.
func (g *Gateway) errorHandler(c *fiber.Ctx, err error) error {
	g.writeError(c, err)
	return nil
}
