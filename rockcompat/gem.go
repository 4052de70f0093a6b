package rockcompat

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/envs"
	"github.com/quarryhq/quarry/execagent/agentapi"
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

// errGemOff: the gateway has no env registry.
var errGemOff = errors.New("the env API is not configured on this gateway (QUARRY_ENVS_FILE)")

// GemRoutes returns ROCK's GEM routes (make, reset, step, close) over e
// (nil: they answer 404).
// Like ROCK's, they answer plain JSON bodies (no envelope); a failure is an
// HTTP error status with {"detail": message}, which the SDK's RockEnv
// quotes in its exception. The env list route (list) is not served.
func (s *Service) GemRoutes(e Envs) []Route {
	route := func(name string, fn func(ctx context.Context, owner string, req gemRequest) (any, error)) Route {
		return Route{Method: fiber.MethodPost, Path: GemPrefix + "/" + name, Handler: func(c *fiber.Ctx) error {
			if e == nil {
				return c.Status(http.StatusNotFound).JSON(map[string]string{"detail": errGemOff.Error()})
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
				status, msg := describeGem(err)
				if status >= 500 {
					s.log.Warn("gem call failed", "route", name, "err", err)
				}
				return c.Status(status).JSON(map[string]string{"detail": msg})
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

// describeGem maps an env API error to an HTTP status and message.
func describeGem(err error) (int, string) {
	var (
		ve *badinput.Error
		ee *envs.Error
		ae *agentapi.Error
	)
	switch {
	case errors.As(err, &ve):
		return http.StatusBadRequest, ve.Error()
	case errors.Is(err, envs.ErrNotEnv):
		return http.StatusConflict, err.Error()
	case errors.As(err, &ee):
		switch ee.Kind {
		case envs.KindInvalidAction:
			return http.StatusBadRequest, ee.Error()
		case envs.KindNotRunning:
			return http.StatusConflict, ee.Error()
		case envs.KindTimeout:
			return http.StatusGatewayTimeout, ee.Error()
		default:
			return http.StatusBadGateway, ee.Error()
		}
	case errors.As(err, &ae) && ae.Code == agentapi.CodeBusy:
		return http.StatusConflict, ae.Message
	}
	f := describe(err)
	return f.httpStatus, f.message
}
