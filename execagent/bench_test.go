package execagent

import (
	"context"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// latencies collects per-operation durations and reports percentiles.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// report adds p50 and p99 (in µs) to the benchmark's metrics.
func (l *latencies) report(b *testing.B) {
	if len(l.d) == 0 {
		return
	}
	slices.Sort(l.d)
	pct := func(p float64) float64 {
		return float64(l.d[int(p*float64(len(l.d)-1))].Microseconds())
	}
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

// BenchmarkSessionRun_True measures `true` in a session over loopback
// HTTP/1.1 with keep-alive: the agent's share of the gateway's p50 goal.
func BenchmarkSessionRun_True(b *testing.B) {
	benchSessionRun(b, "true", 0)
}

// BenchmarkSessionRun_False measures `false` in a session: every run after
// the first carries the previous exit code into $? (bash sources a status
// file, no fork); compare with BenchmarkSessionRun_True.
func BenchmarkSessionRun_False(b *testing.B) {
	benchSessionRun(b, "false", 1)
}

// benchSessionRun runs command in one session per iteration, expecting
// exit code code, and reports the latency percentiles.
func benchSessionRun(b *testing.B, command string, code int) {
	a := newTestAgent(b, nil)
	ctx := context.Background()
	id := newSession(b, a, agentapi.SessionCreateRequest{})
	req := agentapi.SessionRunRequest{Command: command}
	var lat latencies
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		res, err := a.client.RunSession(ctx, id, req)
		lat.add(time.Since(t0))
		if err != nil || res.ExitCode != code {
			b.Fatalf("run: %v %+v", err, res)
		}
	}
	lat.report(b)
}

// BenchmarkSessionRun_Parallel64 runs `true` from 64 concurrent clients,
// each with its own session: throughput (runs/s) of the agent alone.
func BenchmarkSessionRun_Parallel64(b *testing.B) {
	const clients = 64
	a := newTestAgent(b, func(c *Config) { c.MaxSessions = clients })
	ctx := context.Background()
	ids := make(chan string, clients)
	for range clients {
		ids <- newSession(b, a, agentapi.SessionCreateRequest{})
	}
	var lat latencies
	b.SetParallelism((clients + 1) / 2) // GOMAXPROCS is 2 on the CI machine
	start := time.Now()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		id := <-ids
		defer func() { ids <- id }()
		for pb.Next() {
			t0 := time.Now()
			res, err := a.client.RunSession(ctx, id, agentapi.SessionRunRequest{Command: "true"})
			lat.add(time.Since(t0))
			if err != nil || res.ExitCode != 0 {
				b.Errorf("run: %v %+v", err, res)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "runs/s")
	lat.report(b)
}

// BenchmarkExec_True measures a one-shot `true` (a new bash per call).
func BenchmarkExec_True(b *testing.B) {
	a := newTestAgent(b, nil)
	ctx := context.Background()
	req := agentapi.ExecRequest{Command: "true"}
	var lat latencies
	for b.Loop() {
		t0 := time.Now()
		res, err := a.client.Exec(ctx, req)
		lat.add(time.Since(t0))
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec: %v %+v", err, res)
		}
	}
	lat.report(b)
}

// BenchmarkSpawnBash is the baseline a session run is compared with:
// spawning `bash -c true` directly, without HTTP.
func BenchmarkSpawnBash(b *testing.B) {
	path, err := exec.LookPath("bash")
	require.NoError(b, err)
	var lat latencies
	for b.Loop() {
		t0 := time.Now()
		if err := exec.Command(path, "-c", "true").Run(); err != nil {
			b.Fatal(err)
		}
		lat.add(time.Since(t0))
	}
	lat.report(b)
}

// BenchmarkSessionExec_NoHTTP measures a session run without HTTP: the
// shell round trip alone.
func BenchmarkSessionExec_NoHTTP(b *testing.B) {
	a := newTestAgent(b, nil)
	id := newSession(b, a, agentapi.SessionCreateRequest{})
	ss, err := a.srv.sessions.get(id)
	require.NoError(b, err)
	var lat latencies
	for b.Loop() {
		t0 := time.Now()
		res, err := ss.exec(context.Background(), "true", time.Minute, 1<<20)
		lat.add(time.Since(t0))
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("run: %v %+v", err, res)
		}
	}
	lat.report(b)
}
