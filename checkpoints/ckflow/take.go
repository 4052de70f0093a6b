package ckflow

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/warmpool"
)

// TakeRequest says what Take archives.
type TakeRequest struct {
	// Paths are the roots to archive (nil: the agent's work dir; relative
	// ones resolve against it).
	Paths []string
	// Exclude are patterns of what to leave out.
	Exclude []string
	// Labels are the checkpoint's labels.
	Labels map[string]string
}

// CheckTake checks req before an agent is called: the contract's limits
// (checkpoints.CheckPut) on excludes and labels, and the count of paths
// (the agent checks each path and resolves the relative ones). A refusal
// is a *badinput.Error.
func CheckTake(req TakeRequest) error {
	probe := make([]string, max(1, len(req.Paths)))
	for i := range probe {
		probe[i] = "/" // the shape of each path is the agent's to check
	}
	now := time.Now()
	_, err := checkpoints.CheckPut(checkpoints.Checkpoint{
		ID: checkpoints.NewID(), Owner: "o", Format: agentapi.FormatTarGzip, Paths: probe, Exclude: req.Exclude, Labels: req.Labels,
		CreatedAt: now, ExpiresAt: now.Add(time.Hour),
	}, 1)
	return err
}

// Take has lease's agent archive req's paths and streams the archive into
// the store, as the lease owner's checkpoint of lease's pool and image.
// Its errors: the pool's (Leases.Image); the agent's, through
// Leases.CallFailed, also when its stream broke; the store's
// (checkpoints.ErrTooLarge past Config.Checkpoints.MaxBytes, a
// *checkpoints.BudgetError past the budget). Nothing is kept when it
// fails.
func (s *Service) Take(ctx context.Context, lease warmpool.Lease, req TakeRequest) (checkpoints.Checkpoint, error) {
	image, err := s.leases.Image(ctx, lease.Pool)
	if err != nil {
		return checkpoints.Checkpoint{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StreamTimeout)
	defer cancel()
	start := time.Now()
	body, info, err := s.sandboxes.Agent(lease).CheckpointLevel(ctx, req.Paths, req.Exclude, s.cfg.Compression)
	if err != nil {
		return checkpoints.Checkpoint{}, s.leases.CallFailed(ctx, lease, err)
	}
	defer body.Close()
	meta := s.cfg.Checkpoints.Stamp(checkpoints.Checkpoint{
		ID: checkpoints.NewID(), Owner: lease.Owner, Pool: lease.Pool, Image: image, Sandbox: lease.ID,
		Paths: info.Roots, Exclude: req.Exclude, Labels: req.Labels, Format: info.Format, Files: info.Files,
	}, s.clock.Now())
	src := &trackedReader{r: body}
	ck, err := s.store.Put(ctx, meta, src, s.cfg.Checkpoints.MaxBytes)
	if err != nil {
		s.metrics.Failed(OpCreate)
		if be := (*checkpoints.BudgetError)(nil); errors.As(err, &be) {
			s.metrics.Refused(be.Variable())
		}
		if src.err != nil && !errors.Is(err, checkpoints.ErrTooLarge) {
			// The agent's stream broke: that is the failure, not the store.
			return checkpoints.Checkpoint{}, s.leases.CallFailed(ctx, lease, src.err)
		}
		return checkpoints.Checkpoint{}, fmt.Errorf("store checkpoint of sandbox %s: %w", lease.ID, err)
	}
	s.metrics.Taken(ck.SizeBytes, time.Since(start))
	return ck, nil
}

// trackedReader remembers the error its reader returned (io.EOF aside), so
// that a caller can tell a broken source from its sink's failure. With
// endOnError, it returns io.EOF in that error's place (and from then on).
type trackedReader struct {
	r          io.Reader
	err        error
	endOnError bool
}

func (t *trackedReader) Read(p []byte) (int, error) {
	if t.err != nil && t.endOnError {
		return 0, io.EOF
	}
	n, err := t.r.Read(p)
	if err != nil && err != io.EOF && t.err == nil {
		t.err = err
		if t.endOnError {
			return n, io.EOF
		}
	}
	return n, err
}
