package ckflow

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sync/errgroup"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/warmpool"
)

// MaxForks is the most sandboxes one Fork makes.
const MaxForks = 100

// CheckCount refuses a fork count outside 1..MaxForks with a
// *badinput.Error naming the field count.
func CheckCount(count int) error {
	if count < 1 || count > MaxForks {
		return badinput.New("count", "must be between 1 and %d, got %d", MaxForks, count)
	}
	return nil
}

// ForkRequest says what Fork makes.
type ForkRequest struct {
	// Count is how many sandboxes (1..MaxForks).
	Count int
	// LeaseSeconds, Labels: the new leases' (0: the pool's default
	// duration; Labels as they are: the caller decides whether they are
	// the source's). Their env is the source's.
	LeaseSeconds int
	Labels       map[string]string
	// Paths and Exclude are what the checkpoint archives (TakeRequest).
	Paths   []string
	Exclude []string
	// KeepCheckpoint keeps the fork's checkpoint; otherwise it is deleted
	// once every fork is made.
	KeepCheckpoint bool
}

// ForkOutcome is the outcome of one fork: its lease, or its error.
type ForkOutcome struct {
	Lease warmpool.Lease
	Err   error
}

// Fork takes a checkpoint of lease now (Take), then makes req.Count new
// sandboxes of the same pool, owner and env with it restored, each its own
// lease. On a copy-on-write layer (onLayer) each is a sandbox started on
// it. Otherwise the sandboxes are acquired concurrently, then the
// checkpoint is read from the store once and streamed into all of them at
// once; a sandbox whose restore fails is released. All within Config.ForkTimeout;
// each outcome is its sandbox or its own error, in order. The error is Take's (then no sandbox is made) or
// CheckCount's.
func (s *Service) Fork(ctx context.Context, lease warmpool.Lease, req ForkRequest) (checkpoints.Checkpoint, []ForkOutcome, error) {
	if err := CheckCount(req.Count); err != nil {
		return checkpoints.Checkpoint{}, nil, err
	}
	ck, err := s.Take(ctx, lease, TakeRequest{Paths: req.Paths, Exclude: req.Exclude})
	if err != nil {
		return checkpoints.Checkpoint{}, nil, err
	}
	forks := make([]ForkOutcome, req.Count)
	fctx, cancel := context.WithTimeout(ctx, s.cfg.ForkTimeout)
	defer cancel()
	// On a layer, each fork is a sandbox started on it, nothing restored.
	// Otherwise every fork's sandbox first, then the checkpoint, read from
	// the store once and streamed into all of them at once (restoreAll).
	var layer string
	if s.onLayer(fctx, lease.Pool, lease.Owner, ck) {
		layer = ck.SHA256
	}
	acquire := func(i int, layer string) {
		forks[i].Lease, _, forks[i].Err = s.leases.Acquire(fctx, warmpool.AcquireRequest{
			Pool: lease.Pool, Owner: lease.Owner, LeaseSeconds: req.LeaseSeconds, Env: lease.Env, Labels: req.Labels, Layer: layer,
		})
	}
	var eg errgroup.Group // every acquire runs: count is bounded by MaxForks
	for i := range forks {
		eg.Go(func() error { acquire(i, layer); return nil })
	}
	_ = eg.Wait()
	// On a layer, the forks a full pool had no room for take its ready
	// sandboxes, restored by copy.
	var made []int
	var leases []warmpool.Lease
	for i, f := range forks {
		switch {
		case f.Err == nil && layer != "":
		case f.Err == nil:
			made, leases = append(made, i), append(leases, f.Lease)
		case errors.Is(f.Err, warmpool.ErrLayerFull):
			if acquire(i, ""); forks[i].Err == nil {
				made, leases = append(made, i), append(leases, forks[i].Lease)
			}
		}
	}
	if len(leases) > 0 {
		_, errs := s.restoreAll(fctx, leases, ck)
		for j, i := range made {
			if errs[j] != nil {
				s.releaseUnrestored(ctx, leases[j])
				forks[i] = ForkOutcome{Err: fmt.Errorf("restore checkpoint %s into a new sandbox of pool %s: %w", ck.ID, lease.Pool, errs[j])}
			}
		}
	}
	s.endFork(ctx, ck, req.KeepCheckpoint)
	return ck, forks, nil
}

// endFork deletes the checkpoint of a fork once every fork is made, unless
// keep; its layer, if any, goes when the last fork that uses it ends.
func (s *Service) endFork(ctx context.Context, ck checkpoints.Checkpoint, keep bool) {
	if keep {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.CallTimeout)
	defer cancel()
	if err := s.store.Delete(dctx, ck.ID, ck.Owner); err != nil {
		s.log.Warn("delete the checkpoint of a fork", "checkpoint", ck.ID, "err", err)
		return
	}
	s.dropLayer(ctx, ck)
}
