package gateway

import (
	"io"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/e2bcompat"
)

// newE2B builds E2B's control plane over the gateway's manager: its leases
// (SetExpiry and images on demand when the manager has them), the owner the
// credential stored, and the envdAccessToken of e2btoken.go.
func (g *Gateway) newE2B() (*e2bcompat.Service, error) {
	return e2bcompat.New(e2bcompat.Config{
		DefaultPool:    g.cfg.DefaultPool,
		Domain:         g.cfg.E2BDomain,
		MaxJSONBody:    g.cfg.MaxJSONBody,
		MaxTimeout:     maxLeaseSeconds,
		CreateTimeout:  g.cfg.CreateTimeout,
		ManagerTimeout: g.cfg.ManagerTimeout,
		RetryAfter:     g.cfg.RetryAfter,
	}, e2bcompat.Deps{
		Leases: g.mgr,
		Owner:  ownerOf,
		Token:  g.envdToken,
		Body: func(c *fiber.Ctx, limit int64) (io.Reader, error) {
			return openBody(c, limit)
		},
		Logger: g.log.With("api", "e2b"),
		Clock:  g.clock,
	})
}

// e2bRoutes lists E2B's control-plane routes (docs/ARCHITECTURE.md, "E2B's
// routes"), each with credE2BKey. The data plane is routed before the route
// table (e2broute.go).
func (g *Gateway) e2bRoutes() []route {
	var out []route
	for _, rt := range g.e2b.Routes() {
		out = append(out, route{method: rt.Method, path: rt.Path, cred: credE2BKey, handler: rt.Handler})
	}
	return out
}
