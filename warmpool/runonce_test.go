package warmpool_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/warmpool"
	"github.com/quarryhq/quarry/warmpool/boltstore"
)

// newUnstarted builds a manager on a real bbolt store that is never
// started, as the gateway builds it in AWS Lambda.
func newUnstarted(t *testing.T, pools ...warmpool.PoolConfig) (*warmpool.Manager, *boltstore.Store, *fakeClock) {
	t.Helper()
	clock := newFakeClock()
	prov := newFakeProvider(clock)
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "leases.db"), boltstore.Options{})
	require.NoError(t, err)
	cfg := fastConfig()
	cfg.ReplicaID = "lambda-1"
	m, err := warmpool.New(cfg, warmpool.Deps{
		Store: s, Providers: map[string]providers.Provider{"fake": prov}, Pools: pools,
		Agents: newFakeAgents(prov), Clock: clock,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		assert.NoError(t, m.Close(ctx))
		assert.NoError(t, s.Close())
	})
	return m, s, clock
}

func TestManager_RunOnce_FillsPoolAndReleasesLocks(t *testing.T) {
	m, s, clock := newUnstarted(t, testPool(2, 4))
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()

	require.NoError(t, m.RunOnce(ctx))

	st, err := m.Pools(ctx)
	require.NoError(t, err)
	require.Len(t, st, 1)
	assert.Equal(t, 2, st[0].Ready, "the launches finish before RunOnce returns")
	for _, lock := range []string{"pool/default", "reaper", "orphans"} {
		ok, err := s.TryLock(ctx, lock, "another-invocation", time.Minute, clock.Now())
		require.NoError(t, err)
		assert.True(t, ok, "lock %s is released after the pass", lock)
	}
}

func TestManager_RunOnce_ReapsExpiredLease(t *testing.T) {
	m, _, clock := newUnstarted(t, testPool(0, 2))
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()
	l, _, err := m.Acquire(ctx, warmpool.AcquireRequest{Pool: "default", Owner: "alice", LeaseSeconds: 60})
	require.NoError(t, err)

	clock.Advance(2 * time.Minute)
	require.NoError(t, m.RunOnce(ctx))

	got, err := m.Get(ctx, l.ID, "alice")
	require.NoError(t, err)
	assert.Equal(t, warmpool.LeaseExpired, got.State)
}

func TestManager_RunOnce_SkipsPassesWhoseLockIsHeld(t *testing.T) {
	m, s, clock := newUnstarted(t, testPool(2, 4))
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()
	ok, err := s.TryLock(ctx, "pool/default", "other-replica", time.Hour, clock.Now())
	require.NoError(t, err)
	require.True(t, ok)

	require.NoError(t, m.RunOnce(ctx))

	st, err := m.Pools(ctx)
	require.NoError(t, err)
	assert.Equal(t, 0, st[0].Ready+st[0].Launching, "the pool's pass belongs to the lock holder")
}

func TestManager_RunOnce_RefusedWhenStartedOrClosed(t *testing.T) {
	m, _, _ := newUnstarted(t, testPool(0, 2))
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()
	require.NoError(t, m.Start(ctx))
	assert.ErrorContains(t, m.RunOnce(ctx), "was started")
	require.NoError(t, m.Close(ctx))
	assert.ErrorContains(t, m.RunOnce(ctx), "closed")
}
