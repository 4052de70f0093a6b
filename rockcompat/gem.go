package rockcompat

import (
	"context"
	"encoding/json"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/envs"
	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/internal/badinput"
)

// GemPrefix is the path prefix of ROCK's GEM env routes.
const GemPrefix = "/apis/v1/envs/gem"

// Envs is what ROCK's GEM routes need of Quarry's env API; *envs.Service
// implements it.
type Envs interface {
	// Make leases a sandbox for envID and starts its env program.
	Make(ctx context.Context, owner, envID string, opts envs.MakeOptions) (string, error)
	// Reset starts an episode.
	Reset(ctx context.Context, owner, id string, seed *int64, options json.RawMessage) (envs.ResetResult, error)
	// Step sends one action.
	Step(ctx context.Context, owner, id string, action json.RawMessage) (envs.StepResult, error)
	// Close ends the env program and releases the sandbox.
	Close(ctx context.Context, owner, id string) error
}

var _ Envs = (*envs.Service)(nil)

// gemRequest is the body of every GEM route (ROCK's EnvMakeRequest,
// EnvResetRequest, EnvStepRequest, EnvCloseRequest).
type gemRequest struct {
	EnvID     string          `json:"env_id"`
	SandboxID string          `json:"sandbox_id"`
	Seed      *int64          `json:"seed"`
	Action    json.RawMessage `json:"action"`
}

// GemRoutes returns ROCK's GEM routes (make, reset, step, close) over e
// (nil: they answer 404).
// Like ROCK's, they answer plain JSON bodies (no envelope); a failure is an
// HTTP error status with {"detail": message}, which the SDK's RockEnv
// quotes in its exception. The env list route (list) is not served.
func (s *Service) GemRoutes(e Envs) []Route {
	route := func(name string, fn func(ctx context.Context, owner string, req gemRequest) (any, error)) Route {
		return Route{Method: fiber.MethodPost, Path: GemPrefix + "/" + name, Handler: func(c *fiber.Ctx) error {
			if e == nil {
				return s.gemFailed(c, name, envs.ErrOff)
			}
			var req gemRequest
			err := s.decode(c, &req)
			var res any
			if err == nil {
				ctx, cancel := context.WithTimeout(c.UserContext(), s.cfg.CreateTimeout)
				defer cancel()
				res, err = fn(ctx, s.owner(c), req)
			}
			if err != nil {
				return s.gemFailed(c, name, err)
			}
			return c.JSON(res)
		}}
	}
	need := func(field, v string) error {
		if v == "" {
			return badinput.New(field, "is required")
		}
		return nil
	}
	return []Route{
		route("make", func(ctx context.Context, owner string, req gemRequest) (any, error) {
			if err := need("env_id", req.EnvID); err != nil {
				return nil, err
			}
			id, err := e.Make(ctx, owner, req.EnvID, envs.MakeOptions{})
			if err != nil {
				return nil, err
			}
			return map[string]string{"sandbox_id": id}, nil
		}),
		route("reset", func(ctx context.Context, owner string, req gemRequest) (any, error) {
			if err := need("sandbox_id", req.SandboxID); err != nil {
				return nil, err
			}
			return e.Reset(ctx, owner, req.SandboxID, req.Seed, nil)
		}),
		route("step", func(ctx context.Context, owner string, req gemRequest) (any, error) {
			if err := need("sandbox_id", req.SandboxID); err != nil {
				return nil, err
			}
			return e.Step(ctx, owner, req.SandboxID, req.Action)
		}),
		route("close", func(ctx context.Context, owner string, req gemRequest) (any, error) {
			if err := need("sandbox_id", req.SandboxID); err != nil {
				return nil, err
			}
			if err := e.Close(ctx, owner, req.SandboxID); err != nil {
				return nil, err
			}
			return map[string]string{"sandbox_id": req.SandboxID}, nil
		}),
	}
}

// gemFailed answers a failed GEM call as ROCK's GEM API does: the HTTP
// status of err's classification with {"detail": message}, which the SDK's
// RockEnv quotes in its exception; a retryable failure carries Retry-After.
func (s *Service) gemFailed(c *fiber.Ctx, route string, err error) error {
	f := errclass.Of(err)
	if f.Status >= 500 {
		s.log.Warn("gem call failed", "route", route, "err", err)
	}
	if f.Retryable {
		c.Set(fiber.HeaderRetryAfter, errclass.RetryAfter(s.cfg.RetryAfter))
	}
	return c.Status(f.Status).JSON(map[string]string{"detail": f.Message})
}
