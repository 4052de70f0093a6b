package gateway

import (
	"io"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/rockcompat"
)

// rockUploadPath is ROCK's multipart upload route: its body takes the
// upload limits (isUpload).
var rockUploadPath = []byte(rockcompat.Prefix + "/upload")

// newRock builds ROCK's compatibility routes over the gateway's manager.
func (g *Gateway) newRock(images map[string]string) (*rockcompat.Service, error) {
	return rockcompat.New(rockcompat.Config{
		Images:            images,
		DefaultPool:       g.cfg.DefaultPool,
		MaxJSONBody:       g.cfg.MaxJSONBody,
		MaxUploadBody:     g.cfg.MaxUploadBody,
		CreateTimeout:     g.cfg.CreateTimeout,
		ManagerTimeout:    g.cfg.ManagerTimeout,
		RequestTimeout:    g.cfg.RequestTimeout,
		MaxCommandTimeout: g.cfg.MaxCommandTimeout,
		TimeoutMargin:     g.cfg.TimeoutMargin,
		RetryAfter:        g.cfg.RetryAfter,
		PollHold:          time.Duration(g.cfg.RockPollHold),
		NohupExit:         g.cfg.RockNohupExit,
	}, rockcompat.Deps{
		Leases: g.mgr,
		Owner:  ownerOf,
		Agent:  g.agentClient,
		Body: func(c *fiber.Ctx, limit int64) (io.Reader, error) {
			return openBody(c, limit)
		},
		Logger: g.log.With("api", "rock"),
		Clock:  g.clock,
		Leave: func(c *fiber.Ctx, leave func()) func() {
			return watchLeave(c.Context().Conn(), leave).stop
		},
	})
}

// rockRoutes lists ROCK's routes (docs/ROCK.md), each with credRock: the
// sandbox routes, GEM's env routes (404 without an env registry) and the
// port routes (rockports.go).
func (g *Gateway) rockRoutes() []route {
	var e rockcompat.Envs // nil without an env registry: the GEM routes answer 404
	if g.envs != nil {
		e = g.envs
	}
	var out []route
	for _, rt := range append(append(g.rock.Routes(), g.rock.GemRoutes(e)...), g.rockPortRoutes()...) {
		out = append(out, route{method: rt.Method, path: rt.Path, cred: credRock, handler: rt.Handler})
	}
	return out
}
