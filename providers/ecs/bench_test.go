package ecs

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/quarryhq/quarry/internal/stats"
)

// BenchmarkProvider_Launch measures the launch controller's own cost: a
// Launch of 10 names against the fake (tasks run on their first describe,
// polled every 5 ms, rate limits out of the way), reporting p50/p99 per
// Launch and the RunTask and TagResource calls per task (a batch of 10
// takes one RunTask and names each task with one TagResource).
func BenchmarkProvider_Launch(b *testing.B) {
	f := newFake()
	cfg := testConfig()
	p, err := New(cfg, f, Deps{})
	require.NoError(b, err)
	b.Cleanup(func() { _ = p.Close(context.Background()) })
	ctx := context.Background()
	var took []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		tasks, err := p.Launch(ctx, testSpec(), names(fmt.Sprintf("b%d", i), 10))
		took = append(took, time.Since(start))
		require.NoError(b, err)
		require.Len(b, tasks, 10)
	}
	b.StopTimer()
	runCalls, tasksRun, _, _, _, _, _ := f.stats()
	b.ReportMetric(float64(stats.Percentile(took, 50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(stats.Percentile(took, 99).Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(runCalls)/float64(tasksRun), "runtask-calls/task")
	b.ReportMetric(float64(f.tagCount())/float64(tasksRun), "tag-calls/task")
}

// BenchmarkProvider_LaunchAtFargatesRate is a simulation (every figure it
// reports is simulated): N tasks launched by one provider against the fake
// with AWS's published limits and Fargate's start times (30-90 s), every
// duration divided by scale and every rate multiplied by it (bursts stay
// counts), through concurrent Launch calls of 100 names (refills). It
// reports the time to all running as a ratio to the floor of the limits
// ((N - burst) / launch rate + the slowest start), the launch rate reached,
// and DescribeTasks calls per task. QUARRY_BENCH_MAX_STARTING sets the
// start slots in unscaled terms (the old default was 200).
func BenchmarkProvider_LaunchAtFargatesRate(b *testing.B) {
	const n, scale = 2000, 10.0
	maxStarting := 0 // the default: burst + rate × 90 s
	if v := os.Getenv("QUARRY_BENCH_MAX_STARTING"); v != "" {
		var err error
		maxStarting, err = strconv.Atoi(v)
		require.NoError(b, err)
	}
	for b.Loop() {
		f := newFake()
		f.simulatedFargate(scale)
		f.calls = rate.NewLimiter(rate.Limit(20*scale), 20)
		f.launches = rate.NewLimiter(rate.Limit(20*scale), 100)
		cfg := testConfig()
		cfg.RunTaskRate, cfg.RunTaskBurst, cfg.LaunchRate, cfg.LaunchBurst = 20*scale, 20, 20*scale, 100
		cfg.DescribeRate, cfg.DescribeBurst = 20*scale, 40
		cfg.PollInterval = time.Duration(float64(2*time.Second) / scale)
		cfg.StartTimeout = time.Duration(float64(5*time.Minute) / scale)
		if maxStarting > 0 {
			cfg.MaxStarting = maxStarting
		} else {
			cfg.MaxStarting = 100 + int(20*90) // unscaled: the default's formula at AWS's rate
		}
		p, err := New(cfg, f, Deps{})
		require.NoError(b, err)
		start := time.Now()
		var wg sync.WaitGroup
		for i := 0; i < n; i += 100 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tasks, err := p.Launch(context.Background(), testSpec(), names(fmt.Sprintf("s%d", i), 100))
				assert.NoError(b, err)
				assert.Len(b, tasks, 100)
			}()
		}
		wg.Wait()
		took := time.Since(start).Seconds() * scale // in unscaled seconds
		require.NoError(b, p.Close(context.Background()))
		floor := float64(n-100)/20 + 90
		b.ReportMetric(took/floor, "x-floor(simulated)")
		b.ReportMetric(float64(n)/took, "launches/s(simulated)")
		b.ReportMetric(float64(f.describeCount())/float64(n), "describes/task")
	}
}
