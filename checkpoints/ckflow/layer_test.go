package ckflow

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/warmpool"
)

// withLayers makes the env's leases prepare every layer, reading the
// archive through Open as a provider would.
func withLayers(t *testing.T, e *env) {
	e.leases.PrepareLayerFn = func(ctx context.Context, req warmpool.LayerRequest) error {
		rc, err := req.Open(ctx)
		if err != nil {
			return err
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		require.NoError(t, err)
		assert.Equal(t, e.agent.archive, b, "the layer is the checkpoint's bytes")
		return nil
	}
}

func TestService_Fork_OnALayerRestoresNothing(t *testing.T) {
	e := newEnv(t, checkpoints.Budget{})
	withLayers(t, e)
	ck, forks, err := e.svc.Fork(context.Background(), e.lease, ForkRequest{Count: 3})
	require.NoError(t, err)
	for _, f := range forks {
		require.NoError(t, f.Err)
	}
	require.Len(t, e.leases.prepared, 1, "one layer for every fork")
	assert.Equal(t, warmpool.LayerRequest{Pool: pool, Key: ck.SHA256, Roots: ck.Paths}, withoutOpen(e.leases.prepared[0]))
	require.Len(t, e.leases.acquired, 3)
	for _, req := range e.leases.acquired {
		assert.Equal(t, ck.SHA256, req.Layer, "each fork starts on the layer")
	}
	assert.Empty(t, e.agent.restored, "nothing is restored")
	assert.Empty(t, e.kept(t), "the fork's checkpoint is deleted")
	assert.Equal(t, []string{ck.SHA256}, e.leases.dropped, "and its layer dropped: it goes with the last fork")
}

func withoutOpen(r warmpool.LayerRequest) warmpool.LayerRequest { r.Open = nil; return r }

func TestService_Fork_CopiesWhereNoLayerServes(t *testing.T) {
	tests := []struct {
		name     string
		minBytes int64
		prepare  func(context.Context, warmpool.LayerRequest) error
		prepared int
	}{
		{name: "below CowMinBytes", minBytes: 1 << 30, prepared: 0},
		{name: "never", minBytes: -1, prepared: 0},
		{name: "the provider has none", prepared: 1},
		{name: "the preparation failed", prepare: func(context.Context, warmpool.LayerRequest) error { return errors.New("engine down") }, prepared: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, checkpoints.Budget{}, func(c *Config, _ *Deps) { c.CowMinBytes = tt.minBytes })
			e.leases.PrepareLayerFn = tt.prepare
			_, forks, err := e.svc.Fork(context.Background(), e.lease, ForkRequest{Count: 2})
			require.NoError(t, err)
			for _, f := range forks {
				require.NoError(t, f.Err)
			}
			assert.Len(t, e.leases.prepared, tt.prepared)
			for _, req := range e.leases.acquired {
				assert.Empty(t, req.Layer)
			}
			assert.Len(t, e.agent.restored, 2, "every fork restored by copy")
		})
	}
}

func TestService_AcquireRestored_OnALayer(t *testing.T) {
	e := newEnv(t, checkpoints.Budget{})
	withLayers(t, e)
	ck := e.take(t)
	req := warmpool.AcquireRequest{Pool: pool, Owner: owner, LeaseSeconds: 60, IdempotencyKey: "k"}
	l, replayed, err := e.svc.AcquireRestored(context.Background(), req, ck)
	require.NoError(t, err)
	assert.False(t, replayed)
	assert.Equal(t, "sbx-new-1", l.ID)
	require.Len(t, e.leases.acquired, 1)
	want := req
	want.Layer = ck.SHA256
	assert.Equal(t, want, e.leases.acquired[0])
	assert.Empty(t, e.agent.restored)

	e.leases.AcquireFn = func(context.Context, warmpool.AcquireRequest) (warmpool.Lease, bool, error) {
		return warmpool.Lease{}, false, warmpool.ErrNoCapacity
	}
	_, _, err = e.svc.AcquireRestored(context.Background(), req, ck)
	assert.ErrorIs(t, err, warmpool.ErrNoCapacity)
	assert.Contains(t, err.Error(), "on checkpoint "+ck.ID)
}

func TestService_Delete_DropsTheLayer(t *testing.T) {
	e := newEnv(t, checkpoints.Budget{})
	ck := e.take(t)
	require.NoError(t, e.svc.Delete(context.Background(), ck.ID, owner))
	assert.Equal(t, []string{ck.SHA256}, e.leases.dropped)
	require.NoError(t, e.svc.Delete(context.Background(), ck.ID, owner), "idempotent")
	assert.Len(t, e.leases.dropped, 1, "a checkpoint already gone names no layer")
}

func TestService_Fork_AFullPoolsReadySandboxesTakeTheRestByCopy(t *testing.T) {
	e := newEnv(t, checkpoints.Budget{})
	withLayers(t, e)
	var onLayer, made atomic.Int32
	e.leases.AcquireFn = func(_ context.Context, req warmpool.AcquireRequest) (warmpool.Lease, bool, error) {
		if req.Layer != "" && onLayer.Add(1) > 2 {
			return warmpool.Lease{}, false, fmt.Errorf("full: %w: %w", warmpool.ErrLayerFull, warmpool.ErrNoCapacity)
		}
		return warmpool.Lease{ID: fmt.Sprintf("sbx-%d", made.Add(1)), Pool: req.Pool, Owner: req.Owner}, false, nil
	}
	_, forks, err := e.svc.Fork(context.Background(), e.lease, ForkRequest{Count: 4})
	require.NoError(t, err)
	for _, f := range forks {
		require.NoError(t, f.Err)
	}
	assert.Len(t, e.leases.acquired, 6, "four on the layer, two of them refused and acquired again")
	assert.Len(t, e.agent.restored, 2, "the two ready sandboxes are restored by copy, the others not")
}

func TestService_AcquireRestored_AFullPoolsReadySandboxIsRestored(t *testing.T) {
	e := newEnv(t, checkpoints.Budget{})
	withLayers(t, e)
	ck := e.take(t)
	e.leases.AcquireFn = func(_ context.Context, req warmpool.AcquireRequest) (warmpool.Lease, bool, error) {
		if req.Layer != "" {
			return warmpool.Lease{}, false, fmt.Errorf("full: %w: %w", warmpool.ErrLayerFull, warmpool.ErrNoCapacity)
		}
		return warmpool.Lease{ID: "sbx-warm", Pool: req.Pool, Owner: req.Owner}, false, nil
	}
	l, _, err := e.svc.AcquireRestored(context.Background(), warmpool.AcquireRequest{Pool: pool, Owner: owner}, ck)
	require.NoError(t, err)
	assert.Equal(t, "sbx-warm", l.ID)
	assert.Len(t, e.agent.restored, 1)
}
