package gateway

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/checkpoints/ckflow"
	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/warmpool"
)

// Checkpoints (docs/API.md, "Checkpoints"; docs/ARCHITECTURE.md, "Request
// paths"). The routes parse, authorize (the caller's active lease), call
// the checkpoint workflows (package ckflow: take, restore, fork, which
// stream archives between agents and the store) and render; the gateway
// gives the workflows its lease and agent sides (ckadapters.go).

// MaxForks is the most sandboxes one fork makes.
const MaxForks = ckflow.MaxForks

// errCheckpointsOff: the gateway has no checkpoint store (Deps.Checkpoints);
// its checkpoint routes answer 404.
var errCheckpointsOff = errclass.New(http.StatusNotFound, agentapi.CodeNotFound,
	"checkpoints are off on this gateway (it has no checkpoint store)")

// checkpointFields, restoreFields and forkFields are the JSON fields of
// api.CreateCheckpointRequest, api.RestoreRequest and api.ForkRequest.
var (
	checkpointFields = []string{"paths", "exclude", "labels"}
	restoreFields    = []string{"checkpoint"}
	forkFields       = []string{"count", "lease_seconds", "paths", "exclude", "labels", "keep_checkpoint"}
)

// ckService is the gateway's checkpoint side: the workflows and the images
// of the pools. Archives stream to and from agents on the gateway's typed
// agent clients (agentcall.go).
type ckService struct {
	flow *ckflow.Service // nil: checkpoints are off

	mu     sync.Mutex
	images map[string]string // pool → image, read from Manager.Pools
	read   time.Time         // when images was read
}

// newCkService builds g's checkpoint side over store (nil: checkpoints are
// off); g's config, metrics, clock and logger are set.
func newCkService(g *Gateway, store checkpoints.Store, ckCfg checkpoints.Config) (*ckService, error) {
	cfg := g.cfg
	s := &ckService{}
	if store == nil {
		return s, nil
	}
	flow, err := ckflow.New(ckflow.Config{
		Checkpoints: ckCfg, Compression: cfg.CheckpointCompression,
		StreamTimeout: cfg.UploadTimeout, CallTimeout: cfg.ManagerTimeout, ForkTimeout: cfg.CreateTimeout,
		CowMinBytes: cfg.CheckpointCowMinBytes,
	}, ckflow.Deps{
		Store: store, Leases: ckLeases{g: g}, Sandboxes: ckSandboxes{g: g}, Metrics: ckMetrics{m: g.metrics},
		Clock: g.clock, Logger: g.log,
	})
	if err != nil {
		return nil, err
	}
	s.flow = flow
	return s, nil
}

// ckOn returns the checkpoint workflows, or errCheckpointsOff.
func (g *Gateway) ckOn() (*ckflow.Service, error) {
	if g.ck.flow == nil {
		return nil, errCheckpointsOff
	}
	return g.ck.flow, nil
}

// toCheckpoint converts a stored checkpoint for a client.
func toCheckpoint(c checkpoints.Checkpoint) api.Checkpoint {
	return api.Checkpoint{
		ID: c.ID, Pool: c.Pool, Image: c.Image, Sandbox: c.Sandbox, Paths: c.Paths, Exclude: c.Exclude, Labels: c.Labels,
		Format: c.Format, SizeBytes: c.SizeBytes, Files: c.Files, SHA256: c.SHA256, CreatedAt: c.CreatedAt, ExpiresAt: c.ExpiresAt,
	}
}

// archiveLease checks a request that takes a checkpoint (ckflow.CheckTake)
// and returns the workflows and the sandbox's lease when checkpoints are
// on and the lease is active.
func (g *Gateway) archiveLease(c *fiber.Ctx, id string, req ckflow.TakeRequest) (*ckflow.Service, warmpool.Lease, error) {
	if err := ckflow.CheckTake(req); err != nil {
		return nil, warmpool.Lease{}, err
	}
	flow, err := g.ckOn()
	if err != nil {
		return nil, warmpool.Lease{}, err
	}
	lease, err := g.activeLease(c, id)
	return flow, lease, err
}

// createCheckpoint handles POST /v1/sandboxes/{id}/checkpoints: 201 with
// the checkpoint.
func (g *Gateway) createCheckpoint(c *fiber.Ctx) error {
	var req api.CreateCheckpointRequest
	id, err := g.sandboxBody(c, &req, checkpointFields)
	if err != nil {
		return err
	}
	take := ckflow.TakeRequest{Paths: req.Paths, Exclude: req.Exclude, Labels: req.Labels}
	flow, lease, err := g.archiveLease(c, id, take)
	if err != nil {
		return err
	}
	ck, err := flow.Take(c.UserContext(), lease, take)
	if err != nil {
		return errclass.Sandbox(id, err)
	}
	return c.Status(http.StatusCreated).JSON(toCheckpoint(ck))
}

// restoreSandbox handles POST /v1/sandboxes/{id}/restore: the sandbox's
// paths roll back to the checkpoint, in place.
func (g *Gateway) restoreSandbox(c *fiber.Ctx) error {
	var req api.RestoreRequest
	id, err := g.sandboxBody(c, &req, restoreFields)
	if err != nil {
		return err
	}
	if req.Checkpoint == "" {
		return badinput.New("checkpoint", "required: the id of a checkpoint (ckp-...)")
	}
	res, err := g.restoreChecked(c, id, req.Checkpoint)
	if err != nil {
		return err
	}
	return c.JSON(res)
}

// restoreChecked restores the caller's checkpoint ckID into sandbox id:
// it reads the lease and the checkpoint, checks the image, and restores
// (the restore route and the env API's reset).
func (g *Gateway) restoreChecked(c *fiber.Ctx, id, ckID string) (api.RestoreResult, error) {
	flow, err := g.ckOn()
	if err != nil {
		return api.RestoreResult{}, err
	}
	lease, err := g.activeLease(c, id)
	if err != nil {
		return api.RestoreResult{}, err
	}
	ctx := c.UserContext()
	ck, _, err := flow.Resolve(ctx, lease.Owner, ckID, lease.Pool)
	if err != nil {
		return api.RestoreResult{}, err
	}
	res, err := flow.Restore(ctx, lease, ck)
	if err != nil {
		return api.RestoreResult{}, errclass.Sandbox(id, err)
	}
	return api.RestoreResult{SandboxID: id, Checkpoint: ck.ID, Files: res.Files, Bytes: res.Bytes, DurationMS: res.DurationMS}, nil
}

// fromCheckpoint resolves the pool of a create from a checkpoint
// (ckflow.Service.Resolve): the request's pool ("" the checkpoint's),
// which must run the checkpoint's image.
func (g *Gateway) fromCheckpoint(ctx context.Context, owner, id, pool string) (checkpoints.Checkpoint, string, error) {
	flow, err := g.ckOn()
	if err != nil {
		return checkpoints.Checkpoint{}, "", err
	}
	return flow.Resolve(ctx, owner, id, pool)
}

// acquireRestored leases a sandbox with ck restored before it is handed
// out (ckflow.Service.AcquireRestored).
func (g *Gateway) acquireRestored(ctx context.Context, req warmpool.AcquireRequest, ck checkpoints.Checkpoint) (warmpool.Lease, bool, error) {
	flow, err := g.ckOn()
	if err != nil {
		return warmpool.Lease{}, false, err
	}
	return flow.AcquireRestored(ctx, req, ck)
}

// forkSandbox handles POST /v1/sandboxes/{id}/fork: a checkpoint now, then
// count new sandboxes of the same pool with it restored, each its own
// lease (relay token, transcript). The forks are made concurrently; each
// result is its sandbox or its own error.
func (g *Gateway) forkSandbox(c *fiber.Ctx) error {
	var req api.ForkRequest
	id, err := g.sandboxBody(c, &req, forkFields)
	if err != nil {
		return err
	}
	if err := ckflow.CheckCount(req.Count); err != nil {
		return err
	}
	flow, lease, err := g.archiveLease(c, id, ckflow.TakeRequest{Paths: req.Paths, Exclude: req.Exclude})
	if err != nil {
		return err
	}
	labels := req.Labels
	if labels == nil {
		labels = lease.Labels
	}
	cr := api.CreateSandboxRequest{Pool: lease.Pool, LeaseSeconds: req.LeaseSeconds, Env: lease.Env, Labels: labels}
	if err := validateCreate(&cr); err != nil {
		return err
	}
	ck, forks, err := flow.Fork(c.UserContext(), lease, ckflow.ForkRequest{
		Count: req.Count, LeaseSeconds: req.LeaseSeconds, Labels: labels,
		Paths: req.Paths, Exclude: req.Exclude, KeepCheckpoint: req.KeepCheckpoint,
	})
	if err != nil {
		return errclass.Sandbox(id, err)
	}
	out := api.ForkResult{Checkpoint: toCheckpoint(ck), Forks: make([]api.Fork, len(forks))}
	for i, f := range forks {
		if f.Err != nil {
			a := errclass.Of(f.Err)
			out.Forks[i].Error = &api.ForkError{Status: a.Status, Code: a.Code, Message: a.Message}
			continue
		}
		sbx := g.toSandbox(f.Lease)
		out.Forks[i].Sandbox = &sbx
	}
	g.metrics.forked(out.Forks)
	return c.JSON(out)
}

// listCheckpoints handles GET /v1/checkpoints?label=k=v&limit=: the
// caller's checkpoints, newest first.
func (g *Gateway) listCheckpoints(c *fiber.Ctx) error {
	flow, err := g.ckOn()
	if err != nil {
		return err
	}
	args := c.Context().QueryArgs()
	labels, err := labelFilter(args.PeekMulti("label"))
	if err != nil {
		return err
	}
	limit, err := queryInt(args, "limit", checkpoints.DefaultListLimit, 1, checkpoints.MaxListLimit)
	if err != nil {
		return err
	}
	cks, err := flow.List(c.UserContext(), checkpoints.Filter{Owner: ownerOf(c), Labels: labels, Limit: int(limit)})
	if err != nil {
		return err
	}
	out := api.CheckpointList{Checkpoints: make([]api.Checkpoint, 0, len(cks))}
	for _, ck := range cks {
		out.Checkpoints = append(out.Checkpoints, toCheckpoint(ck))
	}
	return c.JSON(out)
}

// getCheckpoint handles GET /v1/checkpoints/{id}.
func (g *Gateway) getCheckpoint(c *fiber.Ctx) error {
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	flow, err := g.ckOn()
	if err != nil {
		return err
	}
	ck, err := flow.Get(c.UserContext(), id, ownerOf(c))
	if err != nil {
		return err
	}
	return c.JSON(toCheckpoint(ck))
}

// deleteCheckpoint handles DELETE /v1/checkpoints/{id}: 204, also for an id
// the caller deleted before; another owner's is 404.
func (g *Gateway) deleteCheckpoint(c *fiber.Ctx) error {
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	flow, err := g.ckOn()
	if err != nil {
		return err
	}
	if err := flow.Delete(c.UserContext(), id, ownerOf(c)); err != nil {
		return err
	}
	return c.SendStatus(http.StatusNoContent)
}

// forkOutcomes counts fork results by outcome for the metrics: "ok" or the
// error's code.
func forkOutcomes(forks []api.Fork) map[string]int {
	out := map[string]int{}
	for _, f := range forks {
		if f.Error != nil {
			out[f.Error.Code]++
		} else {
			out["ok"]++
		}
	}
	return out
}
