package ecs

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
