package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/envs"
	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/warmpool"
)

// makeEnvRequest is the body of POST /v1/envs.
type makeEnvRequest struct {
	EnvID        string            `json:"env_id"`
	LeaseSeconds int               `json:"lease_seconds"`
	Env          map[string]string `json:"env"`
	Labels       map[string]string `json:"labels"`
	// FromCheckpoint restores a checkpoint into the sandbox before the env
	// program starts.
	FromCheckpoint string `json:"from_checkpoint"`
}

var makeEnvFields = []string{"env_id", "lease_seconds", "env", "labels", "from_checkpoint"}

// madeEnv is the answer of POST /v1/envs.
type madeEnv struct {
	SandboxID string `json:"sandbox_id"`
	EnvID     string `json:"env_id"`
}

// resetEnvRequest is the body of POST /v1/sandboxes/{id}/env/reset.
type resetEnvRequest struct {
	Seed    *int64          `json:"seed"`
	Options json.RawMessage `json:"options"`
}

var resetEnvFields = []string{"seed", "options"}

// stepEnvRequest is the body of POST /v1/sandboxes/{id}/env/step.
type stepEnvRequest struct {
	Action json.RawMessage `json:"action"`
}

var stepEnvFields = []string{"action"}

// envInfo is one env of GET /v1/envs.
type envInfo struct {
	ID             string `json:"id"`
	Pool           string `json:"pool"`
	Image          string `json:"image,omitempty"` // an env of an image: its sandboxes' on-demand pool
	StepTimeoutMS  int64  `json:"step_timeout_ms"`
	ResetTimeoutMS int64  `json:"reset_timeout_ms"`
}

// Envs returns the env service the env routes call (nil when the gateway
// has no registry), for other route sets built on it.
func (g *Gateway) Envs() *envs.Service { return g.envs }

// newEnvService builds the env service over the gateway's own lease
// handling; nil without a registry.
func newEnvService(g *Gateway, reg *envs.Registry) (*envs.Service, error) {
	if reg == nil {
		return nil, nil
	}
	svc, err := envs.New(reg, envSandboxes{g: g})
	if err != nil {
		return nil, fmt.Errorf("build env service: %w", err)
	}
	return svc, nil
}

// listEnvs handles GET /v1/envs.
func (g *Gateway) listEnvs(c *fiber.Ctx) error {
	if g.envs == nil {
		return envs.ErrOff
	}
	specs := g.envs.Registry().List()
	out := make([]envInfo, 0, len(specs))
	for _, s := range specs {
		out = append(out, envInfo{ID: s.ID, Pool: s.Pool, Image: s.Image,
			StepTimeoutMS: s.StepTimeout().Milliseconds(), ResetTimeoutMS: s.ResetTimeout().Milliseconds()})
	}
	return c.JSON(fiber.Map{"envs": out})
}

// makeEnv handles POST /v1/envs: 201 with the new sandbox's id.
func (g *Gateway) makeEnv(c *fiber.Ctx) error {
	if g.envs == nil {
		return envs.ErrOff
	}
	idem := string(c.Request().Header.Peek("Idempotency-Key"))
	if len(idem) > maxIdempotencyLen || !badinput.Printable(idem) {
		return badinput.New("Idempotency-Key", "must be at most %d printable ASCII characters", maxIdempotencyLen)
	}
	var req makeEnvRequest
	if err := g.decodeBody(c, &req, makeEnvFields); err != nil {
		return err
	}
	if req.EnvID == "" {
		return badinput.New("env_id", "required: one of GET /v1/envs")
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), g.cfg.CreateTimeout)
	defer cancel()
	id, err := g.envs.Make(ctx, ownerOf(c), req.EnvID, envs.MakeOptions{
		LeaseSeconds: req.LeaseSeconds, Env: req.Env, Labels: req.Labels, IdempotencyKey: idem,
		FromCheckpoint: req.FromCheckpoint,
	})
	if err != nil {
		return err
	}
	return c.Status(http.StatusCreated).JSON(madeEnv{SandboxID: id, EnvID: req.EnvID})
}

// envSandboxID returns the sandbox id of an env route and, when fields is
// not nil, decodes its body strictly into req.
func (g *Gateway) envSandboxID(c *fiber.Ctx, req any, fields []string) (string, error) {
	if g.envs == nil {
		return "", envs.ErrOff
	}
	if fields == nil {
		return pathID(c, "id")
	}
	return g.sandboxBody(c, req, fields)
}

// sandboxBody returns the sandbox id of a route into a sandbox and decodes
// its JSON body strictly into req.
func (g *Gateway) sandboxBody(c *fiber.Ctx, req any, fields []string) (string, error) {
	id, err := pathID(c, "id")
	if err != nil {
		return "", err
	}
	if err := g.decodeBody(c, req, fields); err != nil {
		return "", err
	}
	return id, nil
}

// resetEnv handles POST /v1/sandboxes/{id}/env/reset.
func (g *Gateway) resetEnv(c *fiber.Ctx) error {
	var req resetEnvRequest
	id, err := g.envSandboxID(c, &req, resetEnvFields)
	if err != nil {
		return err
	}
	options, ckID, err := resetCheckpoint(req.Options)
	if err != nil {
		return err
	}
	if ckID != "" {
		if _, err := g.restoreChecked(c, id, ckID); err != nil {
			return err
		}
	}
	res, err := g.envs.Reset(c.UserContext(), ownerOf(c), id, req.Seed, options)
	if err != nil {
		return errclass.Sandbox(id, err)
	}
	return c.JSON(res)
}

// resetCheckpoint takes options.checkpoint out of a reset's options: the
// checkpoint the gateway restores before the env program's reset, which
// gets the other options (none left: the env's defaults).
func resetCheckpoint(options json.RawMessage) (json.RawMessage, string, error) {
	var fields map[string]json.RawMessage
	if len(options) == 0 || json.Unmarshal(options, &fields) != nil || fields["checkpoint"] == nil {
		return options, "", nil // not an object with a checkpoint: the program's to judge
	}
	var id string
	if err := json.Unmarshal(fields["checkpoint"], &id); err != nil || id == "" {
		return nil, "", badinput.New("options.checkpoint", "must be the id of a checkpoint (ckp-...)")
	}
	delete(fields, "checkpoint")
	if len(fields) == 0 {
		return nil, id, nil
	}
	rest, err := json.Marshal(fields)
	if err != nil {
		return nil, "", fmt.Errorf("encode reset options: %w", err)
	}
	return rest, id, nil
}

// stepEnv handles POST /v1/sandboxes/{id}/env/step.
func (g *Gateway) stepEnv(c *fiber.Ctx) error {
	var req stepEnvRequest
	id, err := g.envSandboxID(c, &req, stepEnvFields)
	if err != nil {
		return err
	}
	res, err := g.envs.Step(c.UserContext(), ownerOf(c), id, req.Action)
	if err != nil {
		return errclass.Sandbox(id, err)
	}
	return c.JSON(res)
}

// closeEnv handles POST /v1/sandboxes/{id}/env/close.
func (g *Gateway) closeEnv(c *fiber.Ctx) error {
	id, err := g.envSandboxID(c, nil, nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), g.cfg.ManagerTimeout+10*time.Second)
	defer cancel()
	if err := g.envs.Close(ctx, ownerOf(c), id); err != nil {
		return errclass.Sandbox(id, err)
	}
	return c.JSON(fiber.Map{"sandbox_id": id, "closed": true})
}

// envSandboxes adapts the gateway's lease handling to envs.Sandboxes: the
// same validation as POST /v1/sandboxes, the same lease checks and agent
// clients as proxied calls, and errors the gateway maps as it maps theirs.
type envSandboxes struct{ g *Gateway }

var _ envs.Sandboxes = envSandboxes{}

// Acquire leases a sandbox as POST /v1/sandboxes does, from_checkpoint
// included (the env's pool must run the checkpoint's image).
func (e envSandboxes) Acquire(ctx context.Context, req envs.AcquireRequest) (string, error) {
	cr := api.CreateSandboxRequest{Pool: req.Pool, Image: req.Image, LeaseSeconds: req.LeaseSeconds, Env: req.Env, Labels: req.Labels}
	if cr.Image != "" {
		var err error
		if cr.Pool, err = e.g.imagePool(ctx, req.Owner, &cr); err != nil {
			return "", err
		}
		req.Pool = cr.Pool
	}
	if err := validateCreate(&cr); err != nil {
		return "", err
	}
	areq := warmpool.AcquireRequest{
		Pool: req.Pool, Owner: req.Owner, LeaseSeconds: req.LeaseSeconds,
		Env: req.Env, Labels: req.Labels, IdempotencyKey: req.IdempotencyKey,
	}
	var (
		lease warmpool.Lease
		err   error
	)
	if req.FromCheckpoint != "" {
		var ck checkpoints.Checkpoint
		if ck, _, err = e.g.fromCheckpoint(ctx, req.Owner, req.FromCheckpoint, req.Pool); err != nil {
			return "", err
		}
		lease, _, err = e.g.acquireRestored(ctx, areq, ck)
	} else {
		lease, _, err = e.g.mgr.Acquire(ctx, areq)
	}
	if errors.Is(err, warmpool.ErrNotFound) {
		return "", badinput.New("env_id", "the env's pool %q does not exist on this gateway", req.Pool)
	}
	if err != nil {
		return "", err
	}
	return lease.ID, nil
}

// Open reads the lease (active, unexpired, owned by owner) and returns a
// client of its agent.
func (e envSandboxes) Open(ctx context.Context, owner, id string) (envs.Sandbox, error) {
	lease, err := e.g.usableLease(ctx, id, owner)
	if err != nil {
		return envs.Sandbox{}, err
	}
	agent, err := e.g.agentOf(id, lease)
	if err != nil {
		return envs.Sandbox{}, err
	}
	return envs.Sandbox{Labels: lease.Labels, Agent: &agent}, nil
}

// Release ends the lease as DELETE /v1/sandboxes/{id} does.
func (e envSandboxes) Release(ctx context.Context, owner, id string) error {
	mctx, cancel := context.WithTimeout(ctx, e.g.cfg.ManagerTimeout)
	defer cancel()
	l, err := e.g.mgr.Release(mctx, id, owner)
	if err == nil {
		e.g.leaseGone(l) // drops the agent's client
	}
	return err
}
