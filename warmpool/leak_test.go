package warmpool_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/quarryhq/quarry/warmpool"
)

// A manager that started its loops (reconcile, reap, orphan sweep,
// launches) and served leases stops every goroutine it started when it is
// closed.
func TestManager_Close_LeavesNoGoroutine(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	clock := newFakeClock()
	prov := newFakeProvider(clock)
	e := &env{t: t, path: filepath.Join(t.TempDir(), "leases.db"), prov: prov, agents: newFakeAgents(prov),
		clock: clock, cfg: fastConfig(), pools: []warmpool.PoolConfig{testPool(2, 4)}}
	e.start()
	for range 3 {
		l, _, err := e.m.Acquire(t.Context(), warmpool.AcquireRequest{Pool: "default", Owner: "alice"})
		require.NoError(t, err)
		_, err = e.m.Release(t.Context(), l.ID, "alice")
		require.NoError(t, err)
	}
	e.stop()
}
