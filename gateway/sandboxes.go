package gateway

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/bytebufferpool"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/warmpool"
)

// Limits of what the gateway accepts in a create request and a list query.
const (
	maxIDLen          = 128
	maxNameLen        = 63
	maxLeaseSeconds   = 30 * 24 * 3600
	maxLabels         = 64
	maxLabelValueLen  = 256
	maxIdempotencyLen = 255
	maxListLimit      = 1000
)

// toSandbox converts a lease for a client; an active lease past its expiry
// (not yet reaped) is shown as expired, as the proxy treats it.
func (g *Gateway) toSandbox(l warmpool.Lease) api.Sandbox {
	return api.Sandbox{
		ID: l.ID, Pool: l.Pool, Image: l.Image, State: string(l.StateAt(g.clock.Now())), Reason: l.Reason, Generation: l.Generation,
		CreatedAt: l.CreatedAt, ExpiresAt: l.ExpiresAt, EndedAt: l.EndedAt,
		LeaseSeconds: int(l.Duration / time.Second), Labels: l.Labels,
	}
}

// createFields are the JSON fields of api.CreateSandboxRequest, the body
// of POST /v1/sandboxes.
var createFields = []string{"pool", "image", "class", "cpu", "memory", "disk", "lease_seconds", "env", "labels", "from_checkpoint"}

// createSandbox handles POST /v1/sandboxes: 201 with a new sandbox, 200 when
// the Idempotency-Key was used before by the same key. With
// from_checkpoint, the sandbox is claimed, then the checkpoint restored
// into it, then it is handed out (acquireRestored).
func (g *Gateway) createSandbox(c *fiber.Ctx) error {
	idem := string(c.Request().Header.Peek("Idempotency-Key"))
	if len(idem) > maxIdempotencyLen || !badinput.Printable(idem) {
		return badinput.New("Idempotency-Key", "must be at most %d printable ASCII characters", maxIdempotencyLen)
	}
	var req api.CreateSandboxRequest
	err := g.decodeBody(c, &req, createFields)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), g.cfg.CreateTimeout)
	defer cancel()
	switch {
	case req.Image != "":
		if req.Pool, err = g.imagePool(ctx, ownerOf(c), &req); err != nil {
			return err
		}
	case req.Class != "" || req.CPU != 0 || req.Memory != 0 || req.Disk != 0:
		return badinput.New("image", "class, cpu, memory and disk size a sandbox of an image: name the image too")
	}
	var ck checkpoints.Checkpoint
	if req.FromCheckpoint != "" {
		if ck, req.Pool, err = g.fromCheckpoint(ctx, ownerOf(c), req.FromCheckpoint, req.Pool); err != nil {
			return err
		}
	}
	if req.Pool == "" {
		req.Pool = g.cfg.DefaultPool
	}
	if err := validateCreate(&req); err != nil {
		return err
	}
	areq := warmpool.AcquireRequest{
		Pool: req.Pool, Owner: ownerOf(c), LeaseSeconds: req.LeaseSeconds,
		Env: req.Env, Labels: req.Labels, IdempotencyKey: idem,
	}
	var (
		lease    warmpool.Lease
		replayed bool
	)
	if ck.ID != "" {
		lease, replayed, err = g.acquireRestored(ctx, areq, ck)
	} else {
		lease, replayed, err = g.mgr.Acquire(ctx, areq)
	}
	if errors.Is(err, warmpool.ErrNotFound) {
		return badinput.New("pool", "unknown pool %q", req.Pool)
	}
	if err != nil {
		return err
	}
	status := http.StatusCreated
	if replayed {
		status = http.StatusOK
	}
	return c.Status(status).JSON(g.toSandbox(lease))
}

// validateCreate checks a create request (its pool already defaulted)
// against the gateway's limits.
func validateCreate(r *api.CreateSandboxRequest) error {
	if err := checkName(r.Pool); err != nil {
		return badinput.New("pool", "%s", err.Error())
	}
	if r.LeaseSeconds < 0 || r.LeaseSeconds > maxLeaseSeconds {
		return badinput.New("lease_seconds", "must be between 0 (the pool's default) and %d", maxLeaseSeconds)
	}
	if err := warmpool.ValidateEnv("env", r.Env); err != nil {
		return err // the manager's own limits: a lease keeps its env
	}
	if len(r.Labels) > maxLabels {
		return badinput.New("labels", "at most %d labels", maxLabels)
	}
	for _, k := range sortedKeys(r.Labels) {
		if err := checkName(k); err != nil {
			return badinput.New("labels", "key %q: %s", k, err.Error())
		}
		if v := r.Labels[k]; len(v) > maxLabelValueLen || !badinput.Printable(v) {
			return badinput.New("labels."+k, "must be at most %d printable ASCII characters", maxLabelValueLen)
		}
	}
	return nil
}

// listSandboxes handles GET /v1/sandboxes?pool=&state=&label=k=v&limit=.
func (g *Gateway) listSandboxes(c *fiber.Ctx) error {
	args := c.Context().QueryArgs()
	f := warmpool.LeaseFilter{Owner: ownerOf(c)}
	if p := string(args.Peek("pool")); p != "" {
		if err := checkName(p); err != nil {
			return badinput.New("pool", "%s", err.Error())
		}
		f.Pool = p
	}
	if s := string(args.Peek("state")); s != "" {
		switch st := warmpool.LeaseState(s); st {
		case warmpool.LeaseActive, warmpool.LeaseReleased, warmpool.LeaseExpired, warmpool.LeaseLost:
			f.State = st
		default:
			return badinput.New("state", "must be active, released, expired or lost")
		}
	}
	labels, err := labelFilter(args.PeekMulti("label"))
	if err != nil {
		return err
	}
	limit, err := queryInt(args, "limit", maxListLimit, 1, maxListLimit)
	if err != nil {
		return err
	}
	f.Labels, f.Limit = labels, int(limit)
	ctx, cancel := context.WithTimeout(c.UserContext(), g.cfg.ManagerTimeout)
	defer cancel()
	leases, err := g.mgr.List(ctx, f)
	if err != nil {
		return err
	}
	out := api.SandboxList{Sandboxes: make([]api.Sandbox, 0, len(leases))}
	for _, l := range leases {
		out.Sandboxes = append(out.Sandboxes, g.toSandbox(l))
	}
	return c.JSON(out)
}

// getSandbox handles GET /v1/sandboxes/{id}: the sandbox in any state.
func (g *Gateway) getSandbox(c *fiber.Ctx) error {
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), g.cfg.ManagerTimeout)
	defer cancel()
	lease, err := g.mgr.Get(ctx, id, ownerOf(c))
	if err != nil {
		return errclass.Sandbox(id, err)
	}
	g.leaseGone(lease)
	return c.JSON(g.toSandbox(lease))
}

// heartbeatSandbox handles POST /v1/sandboxes/{id}/heartbeat.
func (g *Gateway) heartbeatSandbox(c *fiber.Ctx) error {
	bb, err := readBody(c, maxHeartbeatBody)
	if err != nil {
		return err
	}
	b := bytes.TrimSpace(bb.B)
	empty := len(b) == 0 || bytes.Equal(b, []byte("{}"))
	err = badinput.CheckJSON(b)
	bytebufferpool.Put(bb)
	if err != nil {
		return err
	}
	if !empty {
		return badinput.New("body", "a heartbeat takes no fields: it extends the lease by the lease_seconds it was created with")
	}
	return g.endOrExtend(c, g.mgr.Heartbeat)
}

// maxHeartbeatBody bounds a heartbeat's body, which may only be empty or {}.
const maxHeartbeatBody = 1 << 10

// releaseSandbox handles DELETE /v1/sandboxes/{id}.
func (g *Gateway) releaseSandbox(c *fiber.Ctx) error {
	return g.endOrExtend(c, g.mgr.Release)
}

// endOrExtend runs a heartbeat or a release and answers the lease, or 410
// saying how the lease had ended.
func (g *Gateway) endOrExtend(c *fiber.Ctx, op func(ctx context.Context, id, owner string) (warmpool.Lease, error)) error {
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), g.cfg.ManagerTimeout)
	defer cancel()
	owner := ownerOf(c)
	lease, err := op(ctx, id, owner)
	if errors.Is(err, warmpool.ErrLeaseEnded) {
		if lease.ID == "" {
			// The caller did not return the ended lease: read it for the message.
			if l, gerr := g.mgr.Get(ctx, id, owner); gerr == nil {
				lease = l
			}
		}
		if gone := g.leaseGone(lease); gone != nil {
			err = gone
		}
	}
	if err != nil {
		return errclass.Sandbox(id, err)
	}
	g.leaseGone(lease)
	return c.JSON(g.toSandbox(lease))
}

// listPools handles GET /v1/pools.
func (g *Gateway) listPools(c *fiber.Ctx) error {
	ctx, cancel := context.WithTimeout(c.UserContext(), g.cfg.ManagerTimeout)
	defer cancel()
	ps, err := g.mgr.Pools(ctx)
	if err != nil {
		return err
	}
	classes, err := g.classesOf(ctx)
	if err != nil {
		return err
	}
	out := api.PoolList{Pools: make([]api.Pool, 0, len(ps)), Classes: classes}
	for _, p := range ps {
		out.Pools = append(out.Pools, api.Pool{
			Name: p.Name, Provider: p.Provider, Image: p.Image, CPU: p.CPU, Memory: int(p.Memory), MemoryMiB: int(p.Memory), DiskMiB: int(p.Disk),
			MinWarm: p.MinWarm, MaxTotal: p.MaxTotal,
			DefaultLeaseSeconds: p.DefaultLeaseSeconds, MaxLeaseSeconds: p.MaxLeaseSeconds,
			Ready: p.Ready, Launching: p.Launching, Leased: p.Leased, Stopping: p.Stopping,
		})
	}
	return c.JSON(out)
}
