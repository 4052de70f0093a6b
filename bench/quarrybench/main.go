// Command quarrybench measures Quarry end to end with real processes on loopback. Suite
// "embedded" (the default): the exec agent alone, the gateway in front of it, warm acquires on
// the embedded store, and the agent's idle memory. Suite "replicas": gateways on DynamoDB (the
// AWS emulator or AWS_ENDPOINT_URL) beside the embedded store: raw PutItem, warm acquires, DynamoDB
// requests per call, and acquires per second across three replicas (replicas.go). Suite "fleet"
// (not part of "all"): 1,000 real process-provider sandboxes leased at once, warm and cold, then
// the Docker provider as far as one host allows (fleet.go). `make bench` runs embedded and
// replicas; docs/BENCHMARKS.md explains each number.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quarryhq/quarry/internal/stats"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "quarrybench:", err)
		os.Exit(1)
	}
}

type options struct {
	bin        string
	out        string
	runs       int
	clients    int
	duration   time.Duration
	acquires   int
	keepTmp    bool
	spawnRuns  int
	sandboxes  int
	warmRounds int
	suite      string
	replicas   replicaOptions
	fleet      fleetOptions
}

func run(ctx context.Context) error {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory with gateway and execagent binaries")
	flag.StringVar(&o.out, "json", "", "write results as JSON to this file")
	flag.IntVar(&o.runs, "runs", 3000, "sequential session runs per latency measurement")
	flag.IntVar(&o.spawnRuns, "spawn-runs", 300, "one-shot execs (spawning bash) for the spawn comparison")
	flag.IntVar(&o.clients, "clients", 64, "concurrent clients for the throughput measurement")
	flag.IntVar(&o.sandboxes, "sandboxes", 8, "sandboxes the concurrent clients spread over")
	flag.DurationVar(&o.duration, "duration", 5*time.Second, "length of the throughput measurement")
	flag.IntVar(&o.acquires, "acquires", 40, "warm acquires per round")
	flag.IntVar(&o.warmRounds, "warm-rounds", 3, "rounds of warm acquires")
	flag.BoolVar(&o.keepTmp, "keep", false, "keep the temporary data directory")
	flag.StringVar(&o.suite, "suite", "embedded", "what to measure: embedded (one gateway, embedded store), replicas (DynamoDB: the AWS emulator or AWS_ENDPOINT_URL, three replicas), all (both), or fleet (1,000 real sandboxes at once, then Docker as far as one host allows: fleet.go)")
	o.replicas.flags()
	o.fleet.flags()
	flag.Parse()
	if o.suite != "embedded" && o.suite != "replicas" && o.suite != "all" && o.suite != "fleet" {
		return fmt.Errorf("-suite: want embedded, replicas, all or fleet, got %q", o.suite)
	}

	tmp, err := os.MkdirTemp("", "quarrybench-")
	if err != nil {
		return err
	}
	if !o.keepTmp {
		defer os.RemoveAll(tmp)
	}
	b := &bench{o: o, tmp: tmp, http: &http.Client{Transport: &http.Transport{
		MaxIdleConns: 512, MaxIdleConnsPerHost: 512, IdleConnTimeout: time.Minute,
	}, Timeout: 2 * time.Minute}}
	defer b.cleanup()
	return b.all(ctx)
}

type bench struct {
	o       options
	tmp     string
	http    *http.Client
	procs   []*exec.Cmd
	results []result
}

type result struct {
	Name  string             `json:"name"`
	Value map[string]float64 `json:"values"`
	Note  string             `json:"note,omitempty"`
}

func (b *bench) record(name, note string, kv ...any) {
	r := result{Name: name, Value: map[string]float64{}, Note: note}
	for i := 0; i+1 < len(kv); i += 2 {
		r.Value[kv[i].(string)] = toFloat(kv[i+1])
	}
	b.results = append(b.results, r)
	keys := make([]string, 0, len(r.Value))
	for k := range r.Value {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%s", k, fmtNum(r.Value[k])))
	}
	fmt.Printf("%-44s %s", name, strings.Join(parts, "  "))
	if note != "" {
		fmt.Printf("   (%s)", note)
	}
	fmt.Println()
}

func toFloat(v any) float64 {
	switch x := v.(type) {
	case float64:
		return x
	case int:
		return float64(x)
	case int64:
		return float64(x)
	case time.Duration:
		return float64(x) / float64(time.Microsecond)
	}
	panic(fmt.Sprintf("unsupported value %T", v))
}

func fmtNum(f float64) string {
	if f == float64(int64(f)) {
		return strconv.FormatInt(int64(f), 10)
	}
	return strconv.FormatFloat(f, 'f', 2, 64)
}

func (b *bench) cleanup() {
	for _, p := range b.procs {
		if p.Process != nil {
			_ = p.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, p := range b.procs {
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = p.Process.Kill()
		}
	}
	// Sandboxes outlive the gateway by design: stop the ones this run left
	// (in every data directory: the suites use several).
	files, _ := filepath.Glob(filepath.Join(b.tmp, "*", "process", "*", "task.json"))
	for _, f := range files {
		if pid := recordedPID(f); pid > 0 {
			killSession(pid)
		}
	}
}

// recordedPID returns the agent pid in a process provider task record
// (task.json), or 0.
func recordedPID(file string) int {
	var tf struct {
		PID int `json:"pid"`
	}
	if data, err := os.ReadFile(file); err == nil && json.Unmarshal(data, &tf) == nil {
		return tf.PID
	}
	return 0
}

// cpuByComponent returns CPU time (µs, user+system) used so far by this process (the
// client), the gateway, the sandboxes' agents and their shells.
func (b *bench) cpuByComponent(gatewayPID int) map[string]int64 {
	return cpuByComponentIn(gatewayPID, filepath.Join(b.tmp, "data"))
}

// cpuByComponentIn is cpuByComponent for the sandboxes of the gateway data
// directory dataDir.
func cpuByComponentIn(gatewayPID int, dataDir string) map[string]int64 {
	out := map[string]int64{"client": cpuOf(os.Getpid()), "gateway": cpuOf(gatewayPID)}
	files, _ := filepath.Glob(filepath.Join(dataDir, "process", "*", "task.json"))
	agents := map[int]bool{}
	for _, f := range files {
		if pid := recordedPID(f); pid > 0 {
			agents[pid] = true
		}
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		sid, err := unix.Getsid(pid)
		if err != nil || !agents[sid] {
			continue
		}
		if pid == sid {
			out["agents"] += cpuOf(pid)
		} else {
			out["shells"] += cpuOf(pid)
		}
	}
	return out
}

// cpuOf returns the user+system CPU time of pid in µs (0 when it cannot be read).
func cpuOf(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return (ut + st) * 1_000_000 / 100 // USER_HZ is 100 on Linux
}

// killSession SIGKILLs every process whose session id is sid (an agent leads its session).
func killSession(sid int) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, err := unix.Getsid(pid); err == nil && s == sid {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
}

func (b *bench) all(ctx context.Context) error {
	bin, err := filepath.Abs(b.o.bin)
	if err != nil {
		return err
	}
	agentBin := filepath.Join(bin, "execagent")
	gatewayBin := filepath.Join(bin, "gateway")
	if b.o.suite == "fleet" {
		if err := b.fleetSuite(ctx, gatewayBin, agentBin); err != nil {
			return err
		}
	}
	if b.o.suite == "embedded" || b.o.suite == "all" {
		if err := b.embedded(ctx, gatewayBin, agentBin); err != nil {
			return err
		}
	}
	if b.o.suite == "replicas" || b.o.suite == "all" {
		if err := b.replicaSuite(ctx, gatewayBin, agentBin); err != nil {
			return err
		}
	}
	if b.o.out != "" {
		data, err := json.MarshalIndent(b.results, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(b.o.out, data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// embedded measures the agent alone, the gateway in front of it, and warm
// acquires, on the embedded store.
func (b *bench) embedded(ctx context.Context, gatewayBin, agentBin string) error {
	// The agent alone.
	direct, err := b.startAgent(ctx, agentBin)
	if err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond)
	rss, err := vmRSS(direct.pid)
	if err != nil {
		return err
	}
	b.record("agent idle RSS", "goal <= 15 MB", "MB", float64(rss)/1024)

	// The gateway with a pool of process-provider sandboxes.
	gw, err := b.startGateway(ctx, gatewayBin, agentBin)
	if err != nil {
		return err
	}

	// Session runs: the agent directly vs through the gateway, interleaved in blocks so
	// that machine noise hits both alike.
	dsess, err := direct.newSession(ctx, b.http)
	if err != nil {
		return fmt.Errorf("direct session: %w", err)
	}
	sbx, err := gw.createSandbox(ctx, b.http)
	if err != nil {
		return err
	}
	gsess, err := gw.newSession(ctx, b.http, sbx)
	if err != nil {
		return fmt.Errorf("gateway session: %w", err)
	}
	var dl, gl []time.Duration
	block := 100
	for i := 0; i < b.o.runs; i += block {
		d, err := timeN(ctx, block, func() error { return dsess.run(ctx, b.http, "true") })
		if err != nil {
			return fmt.Errorf("direct run: %w", err)
		}
		g, err := timeN(ctx, block, func() error { return gsess.run(ctx, b.http, "true") })
		if err != nil {
			return fmt.Errorf("gateway run: %w", err)
		}
		dl, gl = append(dl, d...), append(gl, g...)
	}
	hl, err := timeN(ctx, b.o.runs, func() error { return direct.call(ctx, b.http, http.MethodGet, "/healthz", nil, nil) })
	if err != nil {
		return fmt.Errorf("agent healthz: %w", err)
	}
	b.record("HTTP round trip to agent /healthz (floor)", "loopback HTTP between two processes, no shell",
		"p50_us", stats.Percentile(hl, 50), "p99_us", stats.Percentile(hl, 99))
	dp50, dp99 := stats.Percentile(dl, 50), stats.Percentile(dl, 99)
	gp50, gp99 := stats.Percentile(gl, 50), stats.Percentile(gl, 99)
	b.record("session 'true' direct to agent", "", "p50_us", dp50, "p99_us", dp99)
	b.record("session 'true' through gateway", "goal p50 <= 400us", "p50_us", gp50, "p99_us", gp99)
	b.record("gateway overhead (session no-op)", "goal <= +100us p50, ratio <= 1.6",
		"p50_added_us", gp50-dp50, "ratio_p50", float64(gp50)/float64(dp50))

	// One-shot exec spawns bash each time.
	sp, err := timeN(ctx, b.o.spawnRuns, func() error { return direct.exec(ctx, b.http, "true") })
	if err != nil {
		return fmt.Errorf("spawn exec: %w", err)
	}
	sp50 := stats.Percentile(sp, 50)
	b.record("one-shot exec 'true' (spawns bash), direct", "", "p50_us", sp50, "p99_us", stats.Percentile(sp, 99))
	b.record("session run vs spawning bash", "goal >= 20x", "ratio_p50", float64(sp50)/float64(dp50))

	// Throughput: many clients, each with its own session, spread over several sandboxes.
	sessions := []*session{gsess}
	sbxs := []string{sbx}
	for len(sbxs) < b.o.sandboxes {
		id, err := gw.createSandbox(ctx, b.http)
		if err != nil {
			return err
		}
		sbxs = append(sbxs, id)
	}
	for len(sessions) < b.o.clients {
		s, err := gw.newSession(ctx, b.http, sbxs[len(sessions)%len(sbxs)])
		if err != nil {
			return err
		}
		sessions = append(sessions, s)
	}
	// The same load straight to one agent, for comparison.
	direct64 := []*session{dsess}
	for len(direct64) < b.o.clients {
		s, err := direct.newSession(ctx, b.http)
		if err != nil {
			return err
		}
		direct64 = append(direct64, s)
	}
	agentCPU, clientCPU := cpuOf(direct.pid), cpuOf(os.Getpid())
	dn, dlat, err := throughput(ctx, b.o.duration, direct64, b.http)
	if err != nil {
		return fmt.Errorf("direct throughput: %w", err)
	}
	if dn > 0 {
		b.record(fmt.Sprintf("session runs/s direct to one agent, %d clients", b.o.clients), "",
			"runs_per_s", float64(dn)/b.o.duration.Seconds(), "p50_us", stats.Percentile(dlat, 50), "p99_us", stats.Percentile(dlat, 99),
			"agent_cpu_us_per_run", float64(cpuOf(direct.pid)-agentCPU)/float64(dn),
			"client_cpu_us_per_run", float64(cpuOf(os.Getpid())-clientCPU)/float64(dn))
	}

	cpuBefore := b.cpuByComponent(gw.pid)
	n, lat, err := throughput(ctx, b.o.duration, sessions, b.http)
	if err != nil {
		return fmt.Errorf("throughput: %w", err)
	}
	cpuAfter := b.cpuByComponent(gw.pid)
	b.record(fmt.Sprintf("session runs/s through gateway, %d clients", b.o.clients),
		"goal >= 10,000/s; client, gateway and agents share the machine",
		"runs_per_s", float64(n)/b.o.duration.Seconds(), "p50_us", stats.Percentile(lat, 50), "p99_us", stats.Percentile(lat, 99))
	if n > 0 {
		per := func(k string) float64 { return float64(cpuAfter[k]-cpuBefore[k]) / float64(n) }
		b.record("CPU per session run (64 clients)", "where the machine's time goes",
			"client_us", per("client"), "gateway_us", per("gateway"), "agents_us", per("agents"), "shells_us", per("shells"))
	}

	// Warm acquires on the embedded store: once from a pool whose refill cannot start during
	// the round (max_total == min_warm: the acquire path alone), once while the reconciler
	// refills the pool by launching agents on this same machine.
	for _, pool := range []struct{ name, note string }{
		{"warm", "acquire path alone; goal p99 <= 5 ms"},
		{"refill", "while the pool refills on the same 2 cores"},
	} {
		acq, err := gw.acquireRounds(ctx, b.http, pool.name, b.o.acquires, b.o.warmRounds)
		if err != nil {
			return err
		}
		b.record("warm acquire (POST /v1/sandboxes), pool "+pool.name, pool.note,
			"p50_us", stats.Percentile(acq, 50), "p99_us", stats.Percentile(acq, 99), "samples", len(acq))
	}
	return nil
}

func timeN(ctx context.Context, n int, f func() error) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		start := time.Now()
		if err := f(); err != nil {
			return nil, err
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

func throughput(ctx context.Context, d time.Duration, sessions []*session, hc *http.Client) (int64, []time.Duration, error) {
	var count atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for _, s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, 4096)
			for time.Now().Before(deadline) && ctx.Err() == nil {
				start := time.Now()
				if err := s.run(ctx, hc, "true"); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				local = append(local, time.Since(start))
				count.Add(1)
			}
			mu.Lock()
			lat = append(lat, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return count.Load(), lat, firstErr
}

func vmRSS(pid int) (int64, error) { return statusKB(pid, "VmRSS") }

// statusKB returns a field of /proc/<pid>/status in kB (VmRSS, VmHWM).
func statusKB(pid int, field string) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, field+":") {
			f := strings.Fields(line)
			return strconv.ParseInt(f[1], 10, 64)
		}
	}
	return 0, errors.New("no " + field)
}

// endpoint is something that speaks HTTP with a bearer token: an agent or the gateway.
type endpoint struct {
	base  string
	token string
	pid   int
}

func (e *endpoint) call(ctx context.Context, hc *http.Client, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, e.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+e.token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, strings.TrimSpace(string(data)))
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

type session struct {
	ep   *endpoint
	path string // run path
}

type runResult struct {
	ExitCode int `json:"exit_code"`
}

func (s *session) run(ctx context.Context, hc *http.Client, cmd string) error {
	var r runResult
	if err := s.ep.call(ctx, hc, http.MethodPost, s.path, map[string]any{"command": cmd}, &r); err != nil {
		return err
	}
	if r.ExitCode != 0 {
		return fmt.Errorf("exit code %d", r.ExitCode)
	}
	return nil
}

func (e *endpoint) newSession(ctx context.Context, hc *http.Client) (*session, error) {
	var s struct {
		ID string `json:"id"`
	}
	if err := e.call(ctx, hc, http.MethodPost, "/v1/sessions", map[string]any{}, &s); err != nil {
		return nil, err
	}
	return &session{ep: e, path: "/v1/sessions/" + s.ID + "/run"}, nil
}

func (e *endpoint) exec(ctx context.Context, hc *http.Client, cmd string) error {
	var r runResult
	if err := e.call(ctx, hc, http.MethodPost, "/v1/exec", map[string]any{"command": cmd}, &r); err != nil {
		return err
	}
	if r.ExitCode != 0 {
		return fmt.Errorf("exit code %d", r.ExitCode)
	}
	return nil
}

type gateway struct {
	endpoint
	cmd *exec.Cmd
}

func (g *gateway) createSandbox(ctx context.Context, hc *http.Client) (string, error) {
	return g.createSandboxIn(ctx, hc, "bench")
}

func (g *gateway) createSandboxIn(ctx context.Context, hc *http.Client, pool string) (string, error) {
	var s struct {
		ID string `json:"id"`
	}
	if err := g.call(ctx, hc, http.MethodPost, "/v1/sandboxes", map[string]any{"pool": pool}, &s); err != nil {
		return "", err
	}
	return s.ID, nil
}

// acquireRounds times sequential creates from a pool that has n ready tasks, releasing them
// after each round and waiting for the pool to be ready again.
func (g *gateway) acquireRounds(ctx context.Context, hc *http.Client, pool string, n, rounds int) ([]time.Duration, error) {
	var acq []time.Duration
	for round := 0; round < rounds; round++ {
		if err := g.waitReady(ctx, hc, pool, n); err != nil {
			return nil, err
		}
		var ids []string
		for i := 0; i < n; i++ {
			start := time.Now()
			id, err := g.createSandboxIn(ctx, hc, pool)
			if err != nil {
				return nil, err
			}
			acq = append(acq, time.Since(start))
			ids = append(ids, id)
		}
		for _, id := range ids {
			if err := g.releaseAny(ctx, hc, id); err != nil {
				return nil, err
			}
		}
	}
	return acq, nil
}

func (g *gateway) release(ctx context.Context, hc *http.Client, id string) error {
	return g.call(ctx, hc, http.MethodDelete, "/v1/sandboxes/"+id, nil, nil)
}

func (g *gateway) newSession(ctx context.Context, hc *http.Client, sbx string) (*session, error) {
	var s struct {
		ID string `json:"id"`
	}
	if err := g.call(ctx, hc, http.MethodPost, "/v1/sandboxes/"+sbx+"/sessions", map[string]any{}, &s); err != nil {
		return nil, err
	}
	return &session{ep: &g.endpoint, path: "/v1/sandboxes/" + sbx + "/sessions/" + s.ID + "/run"}, nil
}

func (g *gateway) waitReady(ctx context.Context, hc *http.Client, pool string, n int) error {
	return g.waitReadyWithin(ctx, hc, pool, n, 2*time.Minute)
}

// waitReadyWithin waits until pool has n ready tasks, for at most limit.
func (g *gateway) waitReadyWithin(ctx context.Context, hc *http.Client, pool string, n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var lastErr error
	for time.Now().Before(deadline) {
		var ps struct {
			Pools []struct {
				Name  string `json:"name"`
				Ready int    `json:"ready"`
			} `json:"pools"`
		}
		// A 503 (the store answering slowly while the pool refills) is worth
		// another poll; the last error is reported at the deadline.
		if lastErr = g.call(ctx, hc, http.MethodGet, "/v1/pools", nil, &ps); lastErr != nil && ctx.Err() != nil {
			return lastErr
		}
		for _, p := range ps.Pools {
			if p.Name == pool && p.Ready >= n {
				return nil
			}
		}
		select { // GET /v1/pools reads every pool's tasks from the store: poll gently
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	if lastErr != nil {
		return fmt.Errorf("pool %s did not reach %d ready tasks in %s: %w", pool, n, limit, lastErr)
	}
	return fmt.Errorf("pool %s did not reach %d ready tasks in %s", pool, n, limit)
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func (b *bench) start(cmd *exec.Cmd, logName string) error {
	logf, err := os.Create(filepath.Join(b.tmp, logName))
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	b.procs = append(b.procs, cmd)
	return nil
}

func (b *bench) startAgent(ctx context.Context, path string) (*endpoint, error) {
	addrFile := filepath.Join(b.tmp, "agent.addr")
	work := filepath.Join(b.tmp, "agent-work")
	if err := os.MkdirAll(work, 0o700); err != nil {
		return nil, err
	}
	token := "bench-agent-token-0123456789abcdef"
	cmd := exec.Command(path)
	cmd.Env = append(os.Environ(), "QUARRY_AGENT_ADDR=127.0.0.1:0", "QUARRY_AGENT_TOKEN="+token,
		"QUARRY_AGENT_ADDR_FILE="+addrFile, "QUARRY_AGENT_WORKDIR="+work)
	if err := b.start(cmd, "agent.log"); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if data, err := os.ReadFile(addrFile); err == nil && len(data) > 0 {
			return &endpoint{base: "http://" + strings.TrimSpace(string(data)), token: token, pid: cmd.Process.Pid}, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil, errors.New("agent did not write its address within 30 s")
}

func (b *bench) startGateway(ctx context.Context, gatewayBin, agentBin string) (*gateway, error) {
	pools := fmt.Sprintf(`pools:
  - name: bench
    provider: process
    image: host
    min_warm: %d
    max_total: %d
  - name: warm
    provider: process
    image: host
    min_warm: %d
    max_total: %d
  - name: refill
    provider: process
    image: host
    min_warm: %d
    max_total: %d
`, b.o.sandboxes, b.o.sandboxes*2+4, b.o.acquires, b.o.acquires, b.o.acquires, b.o.acquires*3)
	g, err := b.launchGateway(gatewaySpec{bin: gatewayBin, agentBin: agentBin, name: "gateway", dataDir: filepath.Join(b.tmp, "data"), pools: pools})
	if err != nil {
		return nil, err
	}
	return g, g.waitReady(ctx, b.http, "bench", b.o.sandboxes)
}

// gatewaySpec is one gateway process to start.
type gatewaySpec struct {
	bin, agentBin string
	name          string   // log file name (name.log) and pools file (name-pools.yaml)
	dataDir       string   // QUARRY_DATA_DIR; replicas share one
	pools         string   // the pools file
	env           []string // more QUARRY_* (and AWS_*) settings
}

// benchKey is the API key of every gateway the benchmarks start.
const benchKey = "bench-api-key-0123456789"

// launchGateway starts a gateway on a free loopback port and waits until it
// answers /healthz (not until its pools are ready).
func (b *bench) launchGateway(spec gatewaySpec) (*gateway, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	poolsFile := filepath.Join(b.tmp, spec.name+"-pools.yaml")
	if err := os.WriteFile(poolsFile, []byte(spec.pools), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(spec.bin)
	cmd.Env = append(os.Environ(), "QUARRY_ADDR="+addr, "QUARRY_API_KEYS="+benchKey,
		"QUARRY_DATA_DIR="+spec.dataDir, "QUARRY_POOLS_FILE="+poolsFile,
		"QUARRY_AGENT_BINARY="+spec.agentBin, "QUARRY_LOG_LEVEL=warn")
	cmd.Env = append(cmd.Env, spec.env...)
	if err := b.start(cmd, spec.name+".log"); err != nil {
		return nil, err
	}
	g := &gateway{endpoint{base: "http://" + addr, token: benchKey, pid: cmd.Process.Pid}, cmd}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := b.http.Get(g.base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return g, nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil, fmt.Errorf("gateway %s did not answer /healthz within 30 s (log: %s)", spec.name, filepath.Join(b.tmp, spec.name+".log"))
}
