package warmpool_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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

// BenchmarkManager_AcquireWarmBurst measures what 1,000 trainers see when
// they lease at once from a pool with 1,000 ready tasks: the latency of
// each of the 1,000 concurrent acquires (p50_ms, p99_ms), on the real,
// durable bbolt store with the fake provider and agents (the agent's init
// is instant, so this is the manager's and the store's share). Between
// bursts (untimed) every lease is released and the pool refilled; a burst
// fails unless every acquire was warm.
func BenchmarkManager_AcquireWarmBurst(b *testing.B) {
	const n = 1000
	cfg := fastConfig()
	cfg.ReconcileInterval = 50 * time.Millisecond
	cfg.ReapInterval, cfg.OrphanInterval = time.Second, time.Second
	e := newEnv(b, cfg, testPool(n, 2*n))
	lat := make([]time.Duration, 0, n*b.N)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		require.Eventually(b, func() bool { return e.status().Ready >= n }, 5*time.Minute, 10*time.Millisecond)
		warm := e.counter("quarry_acquires_total", map[string]string{"outcome": "warm"})
		leases := make([]warmpool.Lease, n)
		errs := make([]error, n)
		durs := make([]time.Duration, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for j := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				t0 := time.Now()
				leases[j], _, errs[j] = e.m.Acquire(context.Background(), warmpool.AcquireRequest{Pool: "default", Owner: "bench", Env: map[string]string{"I": "1"}})
				durs[j] = time.Since(t0)
			}()
		}
		b.StartTimer()
		close(start)
		wg.Wait()
		b.StopTimer()
		for _, err := range errs {
			require.NoError(b, err)
		}
		require.Equal(b, warm+n, e.counter("quarry_acquires_total", map[string]string{"outcome": "warm"}), "every acquire was warm")
		lat = append(lat, durs...)
		var rg sync.WaitGroup
		for _, l := range leases {
			rg.Add(1)
			go func() {
				defer rg.Done()
				_, err := e.m.Release(context.Background(), l.ID, "bench")
				assert.NoError(b, err)
			}()
		}
		rg.Wait()
	}
	storetest.ReportLatency(b, lat)
}
