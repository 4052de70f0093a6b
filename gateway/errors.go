package gateway

import (
	"errors"
	"net/http"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/errclass"
)

// writeError answers c with err in Quarry's one JSON error shape
// (api.ErrorBody), rendered from its classification (errclass.Of, after
// fromFiber), and logs server side failures. It replaces whatever answer c
// had. A retryable 503 carries Retry-After.
func (g *Gateway) writeError(c *fiber.Ctx, err error) { g.writeErrorBody(c, err, false) }

// foreignErrorBody is Quarry's error shape with the class's status and
// message also at the top level, the shape E2B's API answers and its SDK
// reads ({"code": 404, "message": "..."}: an int and a string).
type foreignErrorBody struct {
	api.ErrorBody
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// writeForeignError is writeError for a call that is none of Quarry's (an
// unknown path outside /v1, notMatched): the body is a foreignErrorBody, so
// that a client of another API can show the message.
func (g *Gateway) writeForeignError(c *fiber.Ctx, err error) { g.writeErrorBody(c, err, true) }

func (g *Gateway) writeErrorBody(c *fiber.Ctx, err error, foreign bool) {
	a := errclass.Of(fromFiber(err))
	switch {
	case a.Status >= 500 && a.Unexpected():
		g.log.Error("request failed", "method", c.Method(), "path", c.Path(), "status", a.Status, "err", err)
	case a.Status >= 500:
		g.log.Warn("request failed", "method", c.Method(), "path", c.Path(), "status", a.Status, "err", err)
	default:
		g.log.Debug("request refused", "method", c.Method(), "path", c.Path(), "status", a.Status, "err", err)
	}
	resp := c.Response()
	resp.Reset()
	if a.Retryable && a.Status == http.StatusServiceUnavailable {
		resp.Header.Set(fiber.HeaderRetryAfter, errclass.RetryAfter(g.cfg.RetryAfter))
	}
	eb := api.ErrorBody{Error: api.ErrorDetail{Code: a.Code, Message: a.Message}}
	var body any = eb
	if foreign {
		body = foreignErrorBody{ErrorBody: eb, Code: a.Status, Message: a.Message}
	}
	if err := c.Status(a.Status).JSON(body); err != nil {
		g.log.Error("write error answer", "err", err)
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
