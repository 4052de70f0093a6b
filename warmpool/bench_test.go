package warmpool_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
	"github.com/quarryhq/quarry/warmpool/storetest"
)

// BenchmarkManager_AcquireWarm measures Acquire when a ready task waits: a
// claim in the real, durable bbolt store plus the agent init (fake,
// instant). Between iterations (untimed) the lease is released and the
// benchmark waits until the reconciler has a ready task again, so every
// timed acquire is warm; it fails otherwise.
func BenchmarkManager_AcquireWarm(b *testing.B) {
	cfg := fastConfig()
	cfg.ReconcileInterval = 100 * time.Millisecond // acquires and releases wake it
	cfg.ReapInterval, cfg.OrphanInterval = time.Second, time.Second
	e := newEnv(b, cfg, testPool(4, 8))
	req := warmpool.AcquireRequest{Pool: "default", Owner: "bench", Env: map[string]string{"I": "1"}}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		require.Eventually(b, func() bool { return e.status().Ready > 0 }, waitFor, 100*time.Microsecond)
		b.StartTimer()
		start := time.Now()
		l, _, err := e.m.Acquire(b.Context(), req)
		lat = append(lat, time.Since(start))
		b.StopTimer()
		require.NoError(b, err)
		_, err = e.m.Release(b.Context(), l.ID, "bench")
		require.NoError(b, err)
		b.StartTimer()
	}
	b.StopTimer()
	require.Equal(b, float64(b.N), e.counter("quarry_acquires_total", map[string]string{"outcome": "warm"}), "every acquire was warm")
	storetest.ReportLatency(b, lat)
}
