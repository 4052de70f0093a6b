package ckflow

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
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
	res, errs := s.restoreAll(ctx, []warmpool.Lease{lease}, ck)
	return res[0], errs[0]
}

// restoreAll restores ck into every lease (all of one owner) at once,
// reading the blob from the store once: each chunk goes to every agent
// still reading, so the slowest sets the pace and memory stays one chunk.
// An agent that answers early (a refusal) drops out; the others go on. It
// returns each lease's result and error, as Restore does.
func (s *Service) restoreAll(ctx context.Context, leases []warmpool.Lease, ck checkpoints.Checkpoint) ([]agentapi.RestoreResult, []error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StreamTimeout)
	defer cancel()
	start := time.Now()
	results, errs := make([]agentapi.RestoreResult, len(leases)), make([]error, len(leases))
	rc, ck, err := s.store.Open(ctx, ck.ID, leases[0].Owner)
	if err != nil { // a store read (not found, unavailable), not a failed restore
		for i := range errs {
			errs[i] = err
		}
		return results, errs
	}
	defer rc.Close()
	// A failing store reader ends the body as if it were whole: each agent
	// then finds that the gateway does not vouch for it (vouchedBody) and
	// refuses it after removing what it staged, so the answer waits for
	// the sandbox to be as it was (an aborted body would be cleaned up
	// after the answer).
	src := &trackedReader{r: rc, endOnError: true}
	bodies := make([]*io.PipeWriter, len(leases))
	var wg sync.WaitGroup
	for i, lease := range leases {
		pr, pw := io.Pipe()
		bodies[i] = pw
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = s.sandboxes.Agent(lease).Restore(ctx, ck.SHA256, vouchedBody{pr, src, ck.SHA256})
			pr.CloseWithError(errAnswered) // what is still written to it fails at once
		}()
	}
	fanOut(src, bodies)
	wg.Wait()
	for i, lease := range leases {
		switch {
		case src.err != nil:
			errs[i] = fmt.Errorf("read checkpoint %s: %w", ck.ID, src.err)
		case errs[i] != nil:
			errs[i] = s.leases.CallFailed(ctx, lease, errs[i])
		}
		if errs[i] != nil {
			s.metrics.Failed(OpRestore)
			continue
		}
		s.metrics.Restored(ck.SizeBytes, time.Since(start))
	}
	return results, errs
}

// vouchedBody is an agent's body of a restore (agentapi.VouchedBody): the
// store's reader hashed every byte against the checkpoint's SHA-256 and
// failed at the end if they differ (checkpoints.NewVerifyReader), so when
// src ended without an error the gateway vouches for the bytes and the
// agent need not hash them again. Vouch is called after the body's end,
// which comes after src's (fanOut closes the bodies once src has ended).
type vouchedBody struct {
	*io.PipeReader
	src *trackedReader
	sum string
}

func (b vouchedBody) Vouch() string {
	if b.src.err != nil {
		return ""
	}
	return b.sum
}

// errAnswered ends the body of an agent that answered before reading it
// all.
var errAnswered = errors.New("the agent answered before the end of the checkpoint")

// fanOut copies src to every body at once, chunk by chunk, until src ends
// or no body takes more, then closes them all.
func fanOut(src io.Reader, bodies []*io.PipeWriter) {
	defer func() {
		for _, b := range bodies {
			_ = b.Close()
		}
	}()
	open := make([]bool, len(bodies))
	for i := range open {
		open[i] = true
	}
	buf := make([]byte, 256<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			var wg sync.WaitGroup
			for i, b := range bodies {
				if !open[i] {
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, werr := b.Write(buf[:n]); werr != nil {
						open[i] = false
					}
				}()
			}
			wg.Wait()
			if !slices.Contains(open, true) {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// AcquireRestored leases a sandbox and restores ck (Resolved for req's
// owner and pool) into it before it is handed out: the claim comes first
// (a warm sandbox stays warm), and a failed restore releases the sandbox
// and returns the restore's error, so nothing half-restored is handed out.
// A replayed lease (an idempotency key used before) is returned as it is.
//
// On a copy-on-write layer (onLayer) the sandbox is a new one started on
// it, with nothing to restore; a pool full of ready sandboxes
// (warmpool.ErrLayerFull) gives one of them, restored by copy.
func (s *Service) AcquireRestored(ctx context.Context, req warmpool.AcquireRequest, ck checkpoints.Checkpoint) (warmpool.Lease, bool, error) {
	if s.onLayer(ctx, req.Pool, req.Owner, ck) {
		on := req
		on.Layer = ck.SHA256
		lease, replayed, err := s.leases.Acquire(ctx, on)
		switch {
		case err == nil:
			return lease, replayed, nil
		case !errors.Is(err, warmpool.ErrLayerFull): // else a ready sandbox, restored by copy
			return warmpool.Lease{}, false, fmt.Errorf("start a sandbox of pool %s on checkpoint %s: %w", req.Pool, ck.ID, err)
		}
	}
	lease, replayed, err := s.leases.Acquire(ctx, req)
	if err != nil || replayed {
		return lease, replayed, err
	}
	if _, err := s.Restore(ctx, lease, ck); err != nil {
		s.releaseUnrestored(ctx, lease)
		return warmpool.Lease{}, false, fmt.Errorf("restore checkpoint %s into a new sandbox of pool %s: %w", ck.ID, req.Pool, err)
	}
	return lease, false, nil
}

// releaseUnrestored releases a sandbox whose restore failed, so that
// nothing half-restored is handed out (even when ctx has ended).
func (s *Service) releaseUnrestored(ctx context.Context, lease warmpool.Lease) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.CallTimeout)
	defer cancel()
	if err := s.leases.Release(rctx, lease); err != nil {
		s.log.Warn("release sandbox after a failed restore", "lease", lease.ID, "err", err)
	}
}
