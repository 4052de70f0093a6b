package gateway

import (
	"net/http"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/errclass"
)

// writeError answers c with err in Quarry's one JSON error shape, rendered
// from its classification (errclass.Of), and logs server side failures. It
// replaces whatever answer c had. A retryable 503 carries Retry-After.
func (g *Gateway) writeError(c *fiber.Ctx, err error) {
	a := errclass.Of(err)
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
	if err := c.Status(a.Status).JSON(agentapi.ErrorBody{Error: agentapi.ErrorDetail{Code: a.Code, Message: a.Message}}); err != nil {
		g.log.Error("write error answer", "err", err)
	}
}

// errorHandler is fiber's ErrorHandler: errors that escape the middleware
// chain (there should be none) get the same shape.
func (g *Gateway) errorHandler(c *fiber.Ctx, err error) error {
	g.writeError(c, err)
	return nil
}
