package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// benchClient is a keep-alive client sized for 64 concurrent callers.
var benchClient = &http.Client{
	Timeout:   testDeadline,
	Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 0, DisableCompression: true},
}

// benchTarget is one way to run a command in a session: straight to the
// agent or through the gateway.
type benchTarget struct {
	url, auth string
}

func (bt benchTarget) run(body []byte) error {
	req, err := http.NewRequest(http.MethodPost, bt.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", bt.auth)
	req.Header.Set("Content-Type", "application/json")
	resp, err := benchClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return nil
}

// benchSessions starts an agent, a gateway with lease sbx-1 on it, and n
// sessions; it returns, per session, the direct and the gateway target.
func benchSessions(b *testing.B, n int) (direct, viaGateway []benchTarget) {
	b.Helper()
	agent := startAgent(b)
	mgr := newFakeManager(agent.URL)
	mgr.addLease("sbx-1", testKey, agent.URL, 1)
	gw := startGateway(b, mgr, nil)
	for range n {
		resp, body := callJSON(b, http.MethodPost, agent.URL+"/v1/sessions", agentToken, agentapi.SessionCreateRequest{})
		require.Equal(b, http.StatusCreated, resp.StatusCode, "body %s", body)
		id := decode[agentapi.SessionInfo](b, body).ID
		direct = append(direct, benchTarget{url: agent.URL + "/v1/sessions/" + id + "/run", auth: "Bearer " + agentToken})
		viaGateway = append(viaGateway, benchTarget{url: gw.URL + "/v1/sandboxes/sbx-1/sessions/" + id + "/run", auth: "Bearer " + testKey})
	}
	return direct, viaGateway
}

var benchRunBody = func() []byte {
	b, _ := json.Marshal(agentapi.SessionRunRequest{Command: "true", TimeoutMS: 10000})
	return b
}()

// BenchmarkGateway_SessionRun runs `true` in a session alternately straight
// on the agent and through the gateway (one caller), and reports both
// latencies' p50/p99, the gateway's overhead at p50 and the p50 ratio.
// Goals: overhead <= 100 µs, ratio <= 1.6, gateway p50 <= 400 µs.
func BenchmarkGateway_SessionRun(b *testing.B) {
	direct, gw := benchSessions(b, 1)
	for range 200 { // warm up connections and the shell
		require.NoError(b, direct[0].run(benchRunBody))
		require.NoError(b, gw[0].run(benchRunBody))
	}
	d := make([]time.Duration, 0, b.N)
	g := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := direct[0].run(benchRunBody); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := gw[0].run(benchRunBody); err != nil {
			b.Fatal(err)
		}
		d = append(d, t1.Sub(t0))
		g = append(g, time.Since(t1))
	}
	b.StopTimer()
	dp50, dp99 := percentiles(d)
	gp50, gp99 := percentiles(g)
	b.ReportMetric(us(dp50), "direct-p50-µs")
	b.ReportMetric(us(dp99), "direct-p99-µs")
	b.ReportMetric(us(gp50), "gateway-p50-µs")
	b.ReportMetric(us(gp99), "gateway-p99-µs")
	b.ReportMetric(us(gp50-dp50), "overhead-p50-µs")
	b.ReportMetric(float64(gp50)/float64(dp50), "ratio-p50")
}

// BenchmarkGateway_SessionRunParallel64 runs `true` from 64 concurrent
// callers, each in its own session, and reports runs per second straight on
// the agent and through the gateway. Goal: >= 10,000 runs/s through the
// gateway on 2 cores.
func BenchmarkGateway_SessionRunParallel64(b *testing.B) {
	const callers = 64
	procs := runtime.GOMAXPROCS(0)
	// RunParallel starts parallelism*GOMAXPROCS goroutines, each with its
	// own session (a session runs one command at a time).
	parallelism := max(1, callers/procs)
	direct, gw := benchSessions(b, parallelism*procs)
	for _, tc := range []struct {
		name    string
		targets []benchTarget
	}{{"direct", direct}, {"gateway", gw}} {
		b.Run(tc.name, func(b *testing.B) {
			for _, t := range tc.targets {
				require.NoError(b, t.run(benchRunBody))
			}
			var next atomic.Int64
			b.SetParallelism(parallelism)
			start := time.Now()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				t := tc.targets[int(next.Add(1)-1)%len(tc.targets)]
				for pb.Next() {
					if err := t.run(benchRunBody); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "runs/s")
		})
	}
}

// BenchmarkGateway_ProxyParallel64_NoopAgent isolates the gateway: 64
// concurrent callers run a session command against an agent stand-in that
// answers at once, straight and through the gateway (runs/s).
func BenchmarkGateway_ProxyParallel64_NoopAgent(b *testing.B) {
	answer := []byte(`{"exit_code":0,"output":"","duration_ms":0,"timed_out":false,"truncated":false}`)
	gw, agent := gatewayWithAgent(b, answer)
	for _, tc := range []struct {
		name   string
		target benchTarget
	}{
		{"direct", benchTarget{url: agent.URL + "/v1/sessions/ses-1/run", auth: "Bearer " + agentToken}},
		{"gateway", benchTarget{url: gw.URL + "/v1/sandboxes/sbx-1/sessions/ses-1/run", auth: "Bearer " + testKey}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			require.NoError(b, tc.target.run(benchRunBody))
			b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
			start := time.Now()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := tc.target.run(benchRunBody); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "runs/s")
		})
	}
}

func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2], s[len(s)*99/100]
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
