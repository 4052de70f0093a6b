package ckflow

import (
	"context"
	"fmt"
	"time"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/warmpool"
)

// Resolve reads owner's checkpoint id and the pool to restore it into: pool
// ("": the checkpoint's), which must run the checkpoint's image. Its
// errors: Get's; Leases.Image's (an unknown pool); a *badinput.Error
// naming both images when they differ.
func (s *Service) Resolve(ctx context.Context, owner, id, pool string) (checkpoints.Checkpoint, string, error) {
	ck, err := s.Get(ctx, id, owner)
	if err != nil {
		return ck, "", err
	}
	if pool == "" {
		pool = ck.Pool
	}
	image, err := s.leases.Image(ctx, pool)
	if err != nil {
		return ck, "", err
	}
	return ck, pool, checkImage(ck, pool, image)
}

// checkImage refuses to restore ck into a sandbox of pool, whose image is
// image, when the checkpoint was taken on another image.
func checkImage(ck checkpoints.Checkpoint, pool, image string) error {
	if ck.Image == image {
		return nil
	}
	return badinput.New("checkpoint", "checkpoint %s was taken on image %q (pool %s); pool %s runs image %q: restore it into a sandbox of the same image",
		ck.ID, ck.Image, ck.Pool, pool, image)
}

// Restore streams checkpoint ck (Resolved for lease's owner and pool) from
// the store into lease's agent. A corrupt blob fails the store's reader
// before its end, so the agent, which commits only after a clean end of
// the body, changes nothing: the error is the store's
// (checkpoints.ErrCorrupt) whatever the agent said. The agent's errors go
// through Leases.CallFailed.
func (s *Service) Restore(ctx context.Context, lease warmpool.Lease, ck checkpoints.Checkpoint) (agentapi.RestoreResult, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StreamTimeout)
	defer cancel()
	start := time.Now()
	rc, ck, err := s.store.Open(ctx, ck.ID, lease.Owner)
	if err != nil {
		return agentapi.RestoreResult{}, err
	}
	defer rc.Close()
	// A failing store reader ends the body as if it were whole: the agent
	// then finds that it does not hash to ck.SHA256 and refuses it after
	// removing what it staged, so the answer waits for the sandbox to be
	// as it was (an aborted body would be cleaned up after the answer).
	src := &trackedReader{r: rc, endOnError: true}
	res, err := s.sandboxes.Agent(lease).Restore(ctx, ck.SHA256, src)
	if src.err != nil {
		err = fmt.Errorf("read checkpoint %s: %w", ck.ID, src.err)
	} else if err != nil {
		err = s.leases.CallFailed(ctx, lease, err)
	}
	if err != nil {
		s.metrics.Failed(OpRestore)
		return res, err
	}
	s.metrics.Restored(ck.SizeBytes, time.Since(start))
	return res, nil
}

// AcquireRestored leases a sandbox and restores ck (Resolved for req's
// owner and pool) into it before it is handed out: the claim comes first
// (a warm sandbox stays warm), and a failed restore releases the sandbox
// and returns the restore's error, so nothing half-restored is handed out.
// A replayed lease (an idempotency key used before) is returned as it is.
func (s *Service) AcquireRestored(ctx context.Context, req warmpool.AcquireRequest, ck checkpoints.Checkpoint) (warmpool.Lease, bool, error) {
	lease, replayed, err := s.leases.Acquire(ctx, req)
	if err != nil || replayed {
		return lease, replayed, err
	}
	if _, err := s.Restore(ctx, lease, ck); err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.CallTimeout)
		defer cancel()
		if rerr := s.leases.Release(rctx, lease); rerr != nil {
			s.log.Warn("release sandbox after a failed restore", "lease", lease.ID, "err", rerr)
		}
		return warmpool.Lease{}, false, fmt.Errorf("restore checkpoint %s into a new sandbox of pool %s: %w", ck.ID, req.Pool, err)
	}
	return lease, false, nil
}
