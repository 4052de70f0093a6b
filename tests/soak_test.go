//go:build integration && soak

package tests

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

// TestSoak is make soak: one gateway (process provider, embedded store)
// under steady load for QUARRY_SOAK_DURATION (default 30m): workers
// (QUARRY_SOAK_WORKERS, default 4)
// acquire, run commands and a session, write and read a file, drive a
// PTY, serve and fetch a port through the proxy, beat and release; one
// sandbox lives through the whole run and gets the same traffic, so that
// one agent ages with the gateway. Every minute a leased sandbox's agent is
// killed (its round ends with an error, which is counted, not failed).
//
// Every 10 s, between rounds (the load waits for the sample), it samples
// the gateway's RSS, goroutines and open files, and the long-lived agent's
// RSS, threads and open files. After the warm-up
// (5 minutes, or a sixth of a shorter run), each may grow by at most 5 %
// (a least-squares line through the samples after the warm-up, from its
// first sample to its last); once the load stops and its connections
// close, the gateway's goroutines come back to where they were before the
// load (that is the goroutine check: between rounds their count swings
// with the server's and the agent clients' idle workers, which end 10 s
// after their last request, 20 to 99 in a 20-minute run, so a trend over
// the samples measures those). Its metric series are sampled too (in the
// CSV, not bounded: a route's first 404 adds a dozen). The samples are written as CSV (QUARRY_SOAK_OUT, default the
// test's temp dir).
//
// It is built only with the soak tag (make soak), never in make test.
func TestSoak(t *testing.T) {
	duration := 30 * time.Minute
	if s := os.Getenv("QUARRY_SOAK_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		require.NoError(t, err, "QUARRY_SOAK_DURATION")
		require.GreaterOrEqual(t, d, 2*time.Minute, "QUARRY_SOAK_DURATION: the warm-up alone needs a sixth of the run")
		duration = d
	}
	workers := 4
	if s := os.Getenv("QUARRY_SOAK_WORKERS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "QUARRY_SOAK_WORKERS")
		require.True(t, n >= 1 && n <= 16, "QUARRY_SOAK_WORKERS must be 1 to 16")
		workers = n
	}
	warmup := min(5*time.Minute, duration/6)
	// Ended leases stay readable for QUARRY_LEASE_RETENTION (24 h by
	// default) in the embedded store, whose file (mapped, so in the RSS)
	// grows until then: a steady state a soak would reach only after a
	// day. A retention of half the warm-up reaches it within the warm-up.
	g := startGateway(t, `pools:
  - name: default
    image: host
    min_warm: 4
    max_total: 12
`, withEnv("QUARRY_LEASE_RETENTION="+(warmup/2).String()))
	g.waitReady("default", 4)
	transport := &http.Transport{MaxIdleConnsPerHost: 16}
	hc := &http.Client{Transport: transport}
	c := client.New(g.url(), g.key, client.WithHTTPClient(hc))
	base, err := gatewayGoroutines(c)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), duration+10*time.Minute)
	defer cancel()
	long, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{LeaseSeconds: int((duration + 10*time.Minute).Seconds())})
	require.NoError(t, err)
	longAgent := agentPidOf(t, c, long.ID)

	s := &soak{c: c, held: map[string]bool{}, faulted: map[string]bool{}}
	load, stop := context.WithTimeout(ctx, duration)
	defer stop()
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() { defer wg.Done(); s.worker(load, i) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); s.longLived(load, long.ID) }()
	wg.Add(1)
	go func() { defer wg.Done(); s.faults(load, g.dataDir) }()

	var samples []soakSample
	start := time.Now()
	tick := time.NewTicker(10 * time.Second)
	for load.Err() == nil {
		select {
		case <-tick.C:
		case <-load.Done():
			continue
		}
		s.gate.Lock() // the rounds in flight end; new ones wait
		smp, err := sampleSoak(c, g.cmd.Process.Pid, longAgent, time.Since(start))
		s.gate.Unlock()
		require.NoError(t, err, "sample")
		samples = append(samples, smp)
	}
	tick.Stop()
	wg.Wait()

	out := os.Getenv("QUARRY_SOAK_OUT")
	if out == "" {
		out = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(out, 0o755))
	csv := filepath.Join(out, fmt.Sprintf("soak-%s.csv", time.Now().UTC().Format("20060102-150405")))
	require.NoError(t, writeSoakCSV(csv, samples))
	t.Logf("soak: %s, %d workers, %d rounds (%d with an error, %d of them in a sandbox the faults killed), %d faults; samples: %s",
		duration, workers, s.rounds.Load(), s.errs.Load(), s.faultedErrs.Load(), s.kills.Load(), csv)

	var after []soakSample
	for _, smp := range samples {
		if smp.at >= warmup {
			after = append(after, smp)
		}
	}
	require.GreaterOrEqual(t, len(after), 6, "samples after the warm-up")
	for _, m := range soakMeasures {
		first, last := trend(after, m.get)
		growth := (last - first) / first
		t.Logf("soak: %-20s after warm-up %.0f, at the end %.0f (least-squares line over %d samples): %+.1f%%",
			m.name, first, last, len(after), 100*growth)
		assert.LessOrEqual(t, growth, m.bound, "%s grew by %.1f%% after the warm-up (bound %.0f%%)", m.name, 100*growth, 100*m.bound)
	}
	unfaulted := s.errs.Load() - s.faultedErrs.Load()
	assert.Zero(t, unfaulted, "rounds that failed in a sandbox no fault touched: %s", s.firstErr.Load())

	_, err = c.DeleteSandbox(ctx, long.ID)
	require.NoError(t, err)
	transport.CloseIdleConnections()
	eventually(t, time.Minute, "the gateway's goroutines come back to where they were before the load", func() error {
		n, err := gatewayGoroutines(c)
		transport.CloseIdleConnections()
		if err != nil {
			return err
		}
		if n > base {
			return fmt.Errorf("%d goroutines, %d before the load", n, base)
		}
		return nil
	})
}

// soak is the load and its counts.
type soak struct {
	c                   *client.Client
	rounds, errs, kills atomic.Int64
	faultedErrs         atomic.Int64
	firstErr            atomic.Value
	mu                  sync.Mutex
	held, faulted       map[string]bool
	// gate: each round holds it shared; the sampler takes it alone, so
	// that every sample sees the system at rest between rounds (a count of
	// goroutines or files moves with the requests in flight).
	gate sync.RWMutex
}

func (s *soak) worker(ctx context.Context, w int) {
	for round := 0; ctx.Err() == nil; round++ {
		s.gate.RLock()
		s.workerRound(ctx, w, round)
		s.gate.RUnlock()
	}
}

func (s *soak) workerRound(ctx context.Context, w, round int) {
	sbx, err := s.c.CreateSandbox(ctx, client.CreateSandboxRequest{LeaseSeconds: 300})
	if err != nil {
		if ctx.Err() == nil {
			s.fail("", fmt.Errorf("worker %d: create: %w", w, err))
		}
		return
	}
	s.mu.Lock()
	s.held[sbx.ID] = true
	s.mu.Unlock()
	err = s.round(ctx, sbx.ID, 20000+w, round)
	s.mu.Lock()
	delete(s.held, sbx.ID)
	s.mu.Unlock()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	if _, rerr := s.c.DeleteSandbox(rctx, sbx.ID); rerr != nil && err == nil && !client.IsGone(rerr) {
		err = fmt.Errorf("release: %w", rerr)
	}
	cancel()
	s.rounds.Add(1)
	if err != nil && ctx.Err() == nil {
		s.fail(sbx.ID, fmt.Errorf("worker %d round %d: %w", w, round, err))
	}
}

// longLived runs the same rounds on one sandbox for the whole soak.
func (s *soak) longLived(ctx context.Context, id string) {
	for round := 0; ctx.Err() == nil; round++ {
		s.gate.RLock()
		err := s.round(ctx, id, 20100, round)
		s.rounds.Add(1)
		if err != nil && ctx.Err() == nil {
			s.fail("", fmt.Errorf("long-lived sandbox round %d: %w", round, err))
		}
		if _, err := s.c.Heartbeat(ctx, id); err != nil && ctx.Err() == nil {
			s.fail("", fmt.Errorf("long-lived sandbox heartbeat: %w", err))
		}
		s.gate.RUnlock()
	}
}

func (s *soak) fail(id string, err error) {
	s.errs.Add(1)
	s.mu.Lock()
	faulted := id != "" && s.faulted[id]
	s.mu.Unlock()
	if faulted {
		s.faultedErrs.Add(1)
		return
	}
	s.firstErr.CompareAndSwap(nil, err.Error())
}

// round is one episode's traffic on a sandbox.
func (s *soak) round(ctx context.Context, id string, port, round int) error {
	c := s.c
	want := fmt.Sprintf("soak-%d", round)
	res, err := c.Exec(ctx, id, agentapi.ExecRequest{Command: "echo " + want})
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	if strings.TrimSpace(res.Stdout) != want {
		return fmt.Errorf("exec: stdout %q", res.Stdout)
	}
	sess, err := c.CreateSession(ctx, id, agentapi.SessionCreateRequest{})
	if err != nil {
		return fmt.Errorf("session: %w", err)
	}
	if _, err := c.RunSession(ctx, id, sess.ID, agentapi.SessionRunRequest{Command: "cd /tmp && x=" + want}); err != nil {
		return fmt.Errorf("session run: %w", err)
	}
	if err := c.CloseSession(ctx, id, sess.ID); err != nil {
		return fmt.Errorf("session close: %w", err)
	}
	body := bytes.Repeat([]byte(want), 1000)
	if _, err := c.WriteFile(ctx, id, "soak.txt", 0o644, bytes.NewReader(body)); err != nil {
		return fmt.Errorf("write file: %w", err)
	}
	rc, err := c.ReadFile(ctx, id, "soak.txt", 0, 0)
	if err != nil {
		return fmt.Errorf("read file: %w", err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, body) {
		return fmt.Errorf("read file: %d bytes, %v", len(got), err)
	}
	if err := s.pty(ctx, id, want); err != nil {
		return err
	}
	return s.port(ctx, id, port)
}

func (s *soak) pty(ctx context.Context, id, want string) error {
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	term, err := s.c.AttachPTY(pctx, id, client.PTYOptions{})
	if err != nil {
		return fmt.Errorf("pty: %w", err)
	}
	defer term.Close()
	go func() { <-pctx.Done(); term.Close() }()
	if _, err := term.Write([]byte("echo pty-" + want + "; exit 0\n")); err != nil {
		return fmt.Errorf("pty write: %w", err)
	}
	out, err := io.ReadAll(term)
	if !strings.Contains(string(out), "pty-"+want) {
		return fmt.Errorf("pty: %q, %v", out, err)
	}
	return nil
}

// port starts a web server in the sandbox on port, fetches a page through
// the port proxy once it listens, and stops it.
func (s *soak) port(ctx context.Context, id string, port int) error {
	p, err := s.c.StartProcess(ctx, id, agentapi.ProcessStartRequest{
		Argv: []string{"python3", "-m", "http.server", strconv.Itoa(port), "--bind", "127.0.0.1"}})
	if err != nil {
		return fmt.Errorf("start web server: %w", err)
	}
	defer func() { _ = s.c.KillProcess(context.WithoutCancel(ctx), id, p.ID) }()
	u, err := s.c.PortURL(id, port, "/")
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond) // the server's start-up, polled until it answers
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(wctx, http.MethodGet, u, nil)
		resp, err := s.c.PortClient().Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-tick.C:
		case <-wctx.Done():
			return fmt.Errorf("port %d: not answering 200 within 30 s (%v)", port, err)
		}
	}
}

// faults kills a leased sandbox's agent every minute.
func (s *soak) faults(ctx context.Context, dataDir string) {
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s.mu.Lock()
		var ids []string
		for id := range s.held {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		var victim string
		if len(ids) > 0 {
			victim = ids[int(s.kills.Load())%len(ids)]
			s.faulted[victim] = true
		}
		s.mu.Unlock()
		if victim == "" {
			continue
		}
		s.gate.RLock()
		res, err := s.c.Exec(ctx, victim, agentapi.ExecRequest{Command: `read -r -a f < /proc/$$/stat; echo ${f[5]}`})
		if err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(res.Stdout)); err == nil && isAgent(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				s.kills.Add(1)
			}
		}
		s.gate.RUnlock()
	}
}

// agentPidOf is the pid of a sandbox's agent (the session leader of its
// commands).
func agentPidOf(t *testing.T, c *client.Client, id string) int {
	res, err := c.Exec(context.Background(), id, agentapi.ExecRequest{Command: `read -r -a f < /proc/$$/stat; echo ${f[5]}`})
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(res.Stdout))
	require.NoError(t, err)
	require.True(t, isAgent(pid), "pid %d is the agent", pid)
	return pid
}

type soakSample struct {
	series                           float64 // the gateway's metric series (lines of /metrics that are not comments)
	at                               time.Duration
	gwRSS, gwGoroutines, gwFDs       float64
	agentRSS, agentThreads, agentFDs float64
}

var soakMeasures = []struct {
	name  string
	get   func(soakSample) float64
	bound float64
}{
	{"gateway RSS", func(s soakSample) float64 { return s.gwRSS }, 0.05},
	{"gateway open files", func(s soakSample) float64 { return s.gwFDs }, 0.05},
	{"agent RSS", func(s soakSample) float64 { return s.agentRSS }, 0.05},
	{"agent threads", func(s soakSample) float64 { return s.agentThreads }, 0.05},
	{"agent open files", func(s soakSample) float64 { return s.agentFDs }, 0.05},
}

func sampleSoak(c *client.Client, gw, agent int, at time.Duration) (soakSample, error) {
	s := soakSample{at: at}
	var err error
	if s.gwRSS, _, err = procStatus(gw); err != nil {
		return s, err
	}
	if s.agentRSS, s.agentThreads, err = procStatus(agent); err != nil {
		return s, err
	}
	if s.gwFDs, err = openFiles(gw); err != nil {
		return s, err
	}
	if s.agentFDs, err = openFiles(agent); err != nil {
		return s, err
	}
	n, series, err := gatewayMetrics(c)
	s.gwGoroutines, s.series = float64(n), float64(series)
	return s, err
}

// procStatus reads VmRSS (bytes) and Threads from /proc/<pid>/status.
func procStatus(pid int) (rss, threads float64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			rss = v * 1024
		case "Threads:":
			threads = v
		}
	}
	return rss, threads, nil
}

func openFiles(pid int) (float64, error) {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return float64(len(es)), err
}

// gatewayGoroutines reads go_goroutines from the gateway's metrics.
func gatewayGoroutines(c *client.Client) (int, error) {
	n, _, err := gatewayMetrics(c)
	return n, err
}

// gatewayMetrics reads go_goroutines from the gateway's metrics, and
// counts its series (a label that grows with sandboxes grows them).
func gatewayMetrics(c *client.Client) (goroutines, series int, err error) {
	m, err := c.Metrics(context.Background())
	if err != nil {
		return 0, 0, err
	}
	goroutines = -1
	sc := bufio.NewScanner(bytes.NewReader(m))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		series++
		if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, 0, err
			}
			goroutines = int(f)
		}
	}
	if goroutines < 0 {
		return 0, 0, fmt.Errorf("no go_goroutines in the metrics")
	}
	return goroutines, series, nil
}

// trend fits a least-squares line to the samples and returns its values at
// the first and the last sample: growth that persists, not the swing of
// one sample (RSS moves with the garbage collector's cycle).
func trend(ss []soakSample, get func(soakSample) float64) (first, last float64) {
	var n, sx, sy, sxx, sxy float64
	for _, s := range ss {
		x, y := s.at.Seconds(), get(s)
		n++
		sx += x
		sy += y
		sxx += x * x
		sxy += x * y
	}
	slope := (n*sxy - sx*sy) / (n*sxx - sx*sx)
	icept := (sy - slope*sx) / n
	return icept + slope*ss[0].at.Seconds(), icept + slope*ss[len(ss)-1].at.Seconds()
}

func writeSoakCSV(path string, ss []soakSample) error {
	var b strings.Builder
	b.WriteString("seconds,gateway_rss_bytes,gateway_goroutines,gateway_fds,agent_rss_bytes,agent_threads,agent_fds,gateway_series\n")
	for _, s := range ss {
		fmt.Fprintf(&b, "%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f\n", s.at.Seconds(), s.gwRSS, s.gwGoroutines, s.gwFDs, s.agentRSS, s.agentThreads, s.agentFDs, s.series)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
