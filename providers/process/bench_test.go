package process

import (
	"context"
	"net/http"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/providers/providertest"
)

// BenchmarkProvider_LaunchHealthyStop measures, per task, the time from
// Launch to the first healthy answer of its real agent, and the time Stop
// takes, and reports their p50 and p99 in milliseconds.
func BenchmarkProvider_LaunchHealthyStop(b *testing.B) {
	p := newProvider(b, b.TempDir(), providertest.BuildAgent(b))
	httpClient := &http.Client{Timeout: 10 * time.Second}
	ctx := context.Background()
	var ready, stop []time.Duration
	i := 0
	for b.Loop() {
		name := "bench-" + strconv.Itoa(i)
		i++
		start := time.Now()
		tasks, err := p.Launch(ctx, spec("bench"), []string{name})
		require.NoError(b, err)
		client := agentapi.New(tasks[0].AgentURL, tasks[0].AgentToken, httpClient)
		deadline := time.Now().Add(waitTimeout)
		for {
			if _, err := client.Health(ctx); err == nil {
				break
			}
			require.True(b, time.Now().Before(deadline), "agent %s not healthy", name)
			time.Sleep(2 * time.Millisecond)
		}
		ready = append(ready, time.Since(start))
		start = time.Now()
		require.NoError(b, p.Stop(ctx, name, "bench"))
		stop = append(stop, time.Since(start))
	}
	reportPercentiles(b, "ready", ready)
	reportPercentiles(b, "stop", stop)
}

func reportPercentiles(b *testing.B, what string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	pct := func(q float64) float64 {
		return float64(ds[int(q*float64(len(ds)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), what+"-p50-ms")
	b.ReportMetric(pct(0.99), what+"-p99-ms")
}
