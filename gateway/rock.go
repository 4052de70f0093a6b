package gateway

import (
	"bytes"
	"encoding/base64"
	"io"
	"net/http"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

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

// registerRock adds ROCK's routes (docs/ROCK.md), each behind rockAuth.
func (g *Gateway) registerRock() {
	var e rockcompat.Envs // nil without an env registry: the GEM routes answer 404
	if g.envs != nil {
		e = g.envs
	}
	for _, rt := range append(append(g.rock.Routes(), g.rock.GemRoutes(e)...), g.rockPortRoutes()...) { // rockports.go
		g.app.Add(rt.Method, rt.Path, g.rockAuth, rt.Handler)
		g.routes[rt.Path] = true
	}
}

// rockAuth authenticates a ROCK call with a Quarry API key sent any way
// ROCK's SDK can send it: Authorization: Bearer <key>, Authorization: Basic
// (the key as password: a base URL http://rock:<key>@host), XRL-Authorization:
// Bearer <key> (SandboxConfig.xrl_authorization), or X-Key / X-API-Key
// (SandboxConfig.extra_headers). A missing or wrong key answers 401 in
// ROCK's envelope.
func (g *Gateway) rockAuth(c *fiber.Ctx) error {
	key, ok := rockKey(&c.Request().Header)
	if !ok {
		return rockcompat.WriteFailed(c, http.StatusUnauthorized, "authentication failed", 4000,
			"missing API key: send the Quarry API key as XRL-Authorization: Bearer <key>, X-Key, or in the base URL (http://rock:<key>@host)")
	}
	owner, ok := g.keys.owner(key)
	if len(key) > maxAPIKeyLen || !ok {
		return rockcompat.WriteFailed(c, http.StatusUnauthorized, "authentication failed", 4000, "invalid API key")
	}
	c.Locals(ownerLocal, owner)
	return c.Next()
}

// rockKey finds the API key in a ROCK request's headers.
func rockKey(h *fasthttp.RequestHeader) ([]byte, bool) {
	bearer := func(v []byte) []byte {
		if len(v) >= len(bearerPrefix) && bytes.EqualFold(v[:len(bearerPrefix)], bearerPrefix) {
			return bytes.TrimSpace(v[len(bearerPrefix):])
		}
		return nil
	}
	if v := h.Peek(fiber.HeaderAuthorization); len(v) > 0 {
		if k := bearer(v); len(k) > 0 {
			return k, true
		}
		if len(v) > 6 && bytes.EqualFold(v[:6], []byte("Basic ")) {
			dec, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(v[6:])))
			if i := bytes.IndexByte(dec, ':'); err == nil && i >= 0 && i < len(dec)-1 {
				return dec[i+1:], true
			}
		}
	}
	if v := h.Peek("XRL-Authorization"); len(v) > 0 {
		if k := bearer(v); len(k) > 0 {
			return k, true
		}
		return bytes.TrimSpace(v), true
	}
	for _, name := range []string{"X-Key", "X-API-Key"} {
		if v := bytes.TrimSpace(h.Peek(name)); len(v) > 0 {
			return v, true
		}
	}
	return nil, false
}
