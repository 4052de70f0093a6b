package ckflow

import (
	"context"
	"errors"
	"io"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/warmpool"
)

// Copy-on-write layers (docs/ARCHITECTURE.md, "Copy-on-write forks on
// Docker"): a checkpoint of at least Config.CowMinBytes is unpacked once by
// the pool's provider, and the sandboxes of a fork or of a create from it
// start on it, each writing only its own changes; nothing is restored into
// them. Where the provider cannot (ECS, the process provider, a pool whose
// disk bound an overlay cannot keep, a checkpoint of other paths than the
// work directory), the checkpoint is restored into each sandbox as before.

// onLayer prepares ck's layer for the sandboxes of pool (for owner) and
// reports whether they start on it: false when ck is below CowMinBytes or
// the provider cannot, or when the preparation failed (logged; the copy
// still works).
func (s *Service) onLayer(ctx context.Context, pool, owner string, ck checkpoints.Checkpoint) bool {
	if s.cfg.CowMinBytes < 0 || ck.SizeBytes < s.cfg.CowMinBytes {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StreamTimeout)
	defer cancel()
	err := s.leases.PrepareLayer(ctx, warmpool.LayerRequest{
		Pool: pool, Key: ck.SHA256, Roots: ck.Paths,
		Open: func(ctx context.Context) (io.ReadCloser, error) {
			rc, _, err := s.store.Open(ctx, ck.ID, owner)
			return rc, err
		},
	})
	switch {
	case err == nil:
		return true
	case errors.Is(err, providers.ErrNoLayer):
		s.log.Debug("checkpoint restored by copy", "checkpoint", ck.ID, "pool", pool, "why", err)
	default:
		s.log.Warn("prepare a checkpoint's layer failed; restoring by copy", "checkpoint", ck.ID, "pool", pool, "err", err)
	}
	return false
}

// dropLayer tells the providers that ck is gone: its layer goes once no
// sandbox uses it.
func (s *Service) dropLayer(ctx context.Context, ck checkpoints.Checkpoint) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.CallTimeout)
	defer cancel()
	if err := s.leases.DropLayer(ctx, ck.SHA256); err != nil {
		s.log.Warn("drop the layer of a deleted checkpoint", "checkpoint", ck.ID, "err", err)
	}
}
