package e2bcompat

import (
	"context"
	"net/http"
	"strconv"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/warmpool"
)

// E2B's fork and snapshots over Quarry's checkpoints (docs/E2B.md): a
// snapshot is a checkpoint of the sandbox's files (its work directory), not
// of its memory or processes; its id is a templateID that makes a sandbox
// of the same pool with those files restored; a fork is a checkpoint and
// count such sandboxes.

// Checkpoints is an optional dependency (Deps.Checkpoints): Quarry's
// checkpoint workflows, owner-scoped as every checkpoint call is. Without
// it the fork and snapshot routes answer 404, and a checkpoint id is no
// templateID. Errors are the checkpoint store's sentinels, the agent's and
// the lease store's, and *badinput.Error.
type Checkpoints interface {
	// Fork takes a checkpoint of lease's files and makes count sandboxes
	// of its pool with it restored, each leased for leaseSeconds (0: the
	// pool's default): one lease or error each, in order. Its own error is
	// the checkpoint's, when no sandbox was made.
	Fork(ctx context.Context, lease warmpool.Lease, count, leaseSeconds int) ([]warmpool.Lease, []error, error)
	// Take takes a checkpoint of lease's files with labels.
	Take(ctx context.Context, lease warmpool.Lease, labels map[string]string) (checkpoints.Checkpoint, error)
	// Get returns owner's checkpoint id; checkpoints.ErrNotFound when
	// unknown, expired or another owner's.
	Get(ctx context.Context, id, owner string) (checkpoints.Checkpoint, error)
	// List returns owner's checkpoints, newest first, at most limit.
	List(ctx context.Context, owner string, limit int) ([]checkpoints.Checkpoint, error)
	// Delete deletes owner's checkpoint id (nil for one deleted before;
	// checkpoints.ErrNotFound for another owner's).
	Delete(ctx context.Context, id, owner string) error
	// AcquireFrom leases a sandbox of checkpoint id's pool with it restored
	// (req.Pool is set from the checkpoint).
	AcquireFrom(ctx context.Context, req warmpool.AcquireRequest, id string) (warmpool.Lease, error)
}

// SnapshotLabel is the checkpoint label that keeps a snapshot's name.
const SnapshotLabel = "e2b.snapshot"

// maxForks is the most sandboxes one fork makes (SandboxForkRequest).
const maxForks = 100

// errCheckpointsOff answers the fork and snapshot routes of a gateway
// without checkpoints.
var errCheckpointsOff = errclass.New(http.StatusNotFound, "not_found", "snapshots and forks are off on this gateway (it has no checkpoint store)")

// ckOn returns the checkpoint workflows, or errCheckpointsOff.
func (s *Service) ckOn() (Checkpoints, error) {
	if s.ck == nil {
		return nil, errCheckpointsOff
	}
	return s.ck, nil
}

// isSnapshot reports whether a templateID is a snapshot (a checkpoint id)
// this gateway can restore.
func (s *Service) isSnapshot(template string) bool {
	return s.ck != nil && strings.HasPrefix(template, checkpoints.IDPrefix)
}

// fork handles POST /sandboxes/{id}/fork: count (1 to 100, default 1)
// sandboxes with the sandbox's files, each its own result; 201.
func (s *Service) fork(ctx context.Context, c *fiber.Ctx, id, owner string) error {
	ck, err := s.ckOn()
	if err != nil {
		return err
	}
	var req ForkRequest
	if err := s.decode(c, &req, false); err != nil {
		return err
	}
	count, timeout := 1, 0
	if req.Count != nil {
		count = *req.Count
	}
	if count < 1 || count > maxForks {
		return badinput.New("count", "must be from 1 to %d, got %d", maxForks, count)
	}
	if req.Timeout != nil {
		timeout = *req.Timeout
	}
	if err := s.timeoutOf("timeout", timeout); err != nil {
		return err
	}
	lease, err := s.active(ctx, id, owner)
	if err != nil {
		return err
	}
	// The forks take as long as a create (ctx is bounded by the manager's
	// timeout): bounded by CreateTimeout instead.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.CreateTimeout)
	defer cancel()
	leases, errs, err := ck.Fork(fctx, lease, count, timeout)
	if err != nil {
		return errclass.Sandbox(id, err)
	}
	out := make([]ForkResult, len(leases))
	for i, l := range leases {
		if errs[i] != nil {
			e := ErrorOf(errclass.Of(errs[i]))
			out[i].Error = &e
			continue
		}
		sbx := s.sandboxOf(l)
		out[i].Sandbox = &sbx
	}
	return c.Status(http.StatusCreated).JSON(out)
}

// snapshot handles POST /sandboxes/{id}/snapshots: a checkpoint of the
// sandbox's files, named name when given; 201 with its id, a templateID.
func (s *Service) snapshot(ctx context.Context, c *fiber.Ctx, id, owner string) error {
	ck, err := s.ckOn()
	if err != nil {
		return err
	}
	var req SnapshotRequest
	lease, err := s.activeWith(ctx, c, id, owner, &req)
	if err != nil {
		return err
	}
	var labels map[string]string
	if req.Name != "" {
		labels = map[string]string{SnapshotLabel: req.Name}
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.CreateTimeout)
	defer cancel()
	taken, err := ck.Take(cctx, lease, labels)
	if err != nil {
		return errclass.Sandbox(id, err)
	}
	return c.Status(http.StatusCreated).JSON(snapshotOf(taken))
}

// snapshotOf is the SnapshotInfo of a checkpoint: its id, and its name when
// it has one.
func snapshotOf(ck checkpoints.Checkpoint) SnapshotInfo {
	names := []string{}
	if n := ck.Labels[SnapshotLabel]; n != "" {
		names = append(names, n)
	}
	return SnapshotInfo{SnapshotID: ck.ID, Names: names}
}

// snapshots handles GET /snapshots?sandboxID=&name=&limit=&nextToken=: the
// caller's checkpoints, newest first; nextToken is an offset, as a list's.
func (s *Service) snapshots(c *fiber.Ctx, owner string) error {
	ck, err := s.ckOn()
	if err != nil {
		return err
	}
	args := c.Context().QueryArgs()
	limit, offset, err := pageOf(args.Peek)
	if err != nil {
		return err
	}
	sandbox, name := string(args.Peek("sandboxID")), string(args.Peek("name"))
	ctx, cancel := s.withTimeout(c)
	defer cancel()
	cks, err := ck.List(ctx, owner, checkpoints.MaxListLimit)
	if err != nil {
		return err
	}
	out := []SnapshotInfo{}
	matched := 0
	for _, k := range cks {
		if sandbox != "" && k.Sandbox != sandbox || name != "" && k.ID != name && k.Labels[SnapshotLabel] != name {
			continue
		}
		if matched++; matched > offset && len(out) < limit {
			out = append(out, snapshotOf(k))
		}
	}
	if matched > offset+limit {
		c.Set(HeaderNextToken, strconv.Itoa(offset+limit))
	}
	return c.JSON(out)
}

// deleteSnapshot handles DELETE /templates/{id} for a snapshot: 204; an
// unknown one (or another owner's) 404, which the SDK's delete_snapshot
// answers False. Templates are not served: any other id is 404.
func (s *Service) deleteSnapshot(c *fiber.Ctx, owner string) error {
	ck, err := s.ckOn()
	if err != nil {
		return err
	}
	id, err := sandboxID(c)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(id, checkpoints.IDPrefix) {
		return errclass.New(http.StatusNotFound, "not_found", "template "+id+" not found: Quarry's templates are pools, which the API does not delete")
	}
	ctx, cancel := s.withTimeout(c)
	defer cancel()
	if _, err := ck.Get(ctx, id, owner); err != nil {
		return err
	}
	if err := ck.Delete(ctx, id, owner); err != nil {
		return err
	}
	return c.SendStatus(http.StatusNoContent)
}
