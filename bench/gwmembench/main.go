// Command gwmembench measures what 10,000 leases and 10,000 idle keep-alive
// client connections cost a real gateway process: its RSS (VmRSS of
// /proc/<pid>/status) and the Go runtime's own counts (/metrics), at each
// step of:
//
//  1. start: cmd/gateway (built with -tags benchfarm, so that it has the
//     farm provider; everything else is the production binary: embedded
//     store, warm pool manager, relay, ROCK and env routes) with one pool of
//     min_warm = max_total = N;
//  2. ready: the pool holds N ready tasks (the manager health-checked every
//     agent);
//  3. leased: N acquires through the API (each a claim and an agent init),
//     over a few keep-alive connections;
//  4. called: one exec per lease through the gateway (the gateway's agent
//     clients: one per agent), over the same few connections;
//  5. connections: C more client connections, each of which makes one exec
//     call and then stays open, idle.
//
// The agents are an agent farm: a few processes of this program (-role
// agents) that serve the agent protocol for thousands of endpoints, one per
// loopback address 127.<b>.x.y (the whole 127.0.0.0/8 is loopback), so
// nothing runs per sandbox. Each process stays under the 20,000 open files
// limit: agents are split across processes, and the client connections are
// this process's. Run it from the repository root:
//
//	go run ./bench/gwmembench -n 10000 -json out.json
//
// docs/BENCHMARKS.md ("What 10,000 cost") has the numbers.
package main

import (
	"bufio"
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
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/quarryhq/quarry/bench/gwmembench/farm"
	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gwmembench:", err)
		os.Exit(1)
	}
}

type options struct {
	role        string
	n           int
	conns       int
	workers     int
	agentProcs  int
	answerBytes int
	rate        int
	settle      time.Duration
	timeout     time.Duration
	gatewayBin  string
	dataParent  string
	out         string
	addrBase    int
	agentPort   int
	gatewayEnv  string
	profiles    string
	// the agents role
	first, count int
}

const apiKey = "gwmembench-key-0123456789abcdef"

func run(ctx context.Context) error {
	var o options
	flag.StringVar(&o.role, "role", "driver", "driver, or agents (started by the driver)")
	flag.IntVar(&o.n, "n", 10000, "leases (and farm endpoints)")
	flag.IntVar(&o.conns, "conns", -1, "idle client connections (-1: as many as leases)")
	flag.IntVar(&o.workers, "workers", 32, "keep-alive connections that acquire and call")
	flag.IntVar(&o.agentProcs, "agent-procs", 2, "agent farm processes")
	flag.IntVar(&o.answerBytes, "answer-bytes", 4096, "stdout bytes in each exec answer")
	flag.IntVar(&o.rate, "rate", 400, "idle connections opened per second (each makes one exec call)")
	flag.DurationVar(&o.settle, "settle", 15*time.Second, "wait before each measurement (the gateway closes agent connections idle for 10 s)")
	flag.DurationVar(&o.timeout, "timeout", 12*time.Minute, "bound of the whole run")
	flag.StringVar(&o.gatewayBin, "gateway", "", "gateway binary built with -tags benchfarm (empty: build one)")
	flag.StringVar(&o.dataParent, "data", "", "parent of the run's temporary directory (empty: /dev/shm when present)")
	flag.StringVar(&o.out, "json", "", "write the results as JSON to this file")
	flag.IntVar(&o.addrBase, "addr-base", 77, "second byte of the agents' loopback addresses 127.<b>.x.y")
	flag.IntVar(&o.agentPort, "agent-port", 7070, "port of every agent endpoint")
	flag.StringVar(&o.gatewayEnv, "gateway-env", "", "extra VAR=value pairs for the gateway, comma separated")
	flag.StringVar(&o.profiles, "profiles", "", "save the gateway's heap and goroutine profiles at each step into this directory")
	flag.IntVar(&o.first, "first", 0, "agents role: first endpoint")
	flag.IntVar(&o.count, "count", 0, "agents role: endpoints")
	flag.Parse()
	if o.addrBase < 0 || o.addrBase > 255 {
		return fmt.Errorf("-addr-base: want 0..255, got %d", o.addrBase)
	}
	if o.role == "agents" {
		return runAgents(ctx, o)
	}
	if o.conns < 0 {
		o.conns = o.n
	}
	if o.n <= 0 || o.workers <= 0 || o.agentProcs <= 0 || o.rate <= 0 {
		return errors.New("-n, -workers, -agent-procs and -rate must be positive")
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	return drive(ctx, o)
}

// checkpoint is one measurement of the gateway process.
type checkpoint struct {
	Name    string             `json:"name"`
	Seconds float64            `json:"seconds"` // since the gateway started
	Proc    map[string]int64   `json:"proc"`    // /proc/<pid>/status, bytes
	Metrics map[string]float64 `json:"metrics"` // from /metrics
}

// result is the whole run.
type result struct {
	N, Conns, AnswerBytes int
	Checkpoints           []checkpoint       `json:"checkpoints"`
	PerItem               map[string]float64 `json:"per_item"` // bytes
	Notes                 []string           `json:"notes"`
}

// procFields are read from /proc/<pid>/status.
var procFields = []string{"VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"}

// metricNames are read from the gateway's /metrics (unlabelled series).
var metricNames = []string{
	"go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes", "go_memstats_sys_bytes",
	"go_memstats_heap_objects", "go_goroutines", "process_open_fds", "quarry_gateway_agent_clients",
	"go_gc_gomemlimit_bytes",
}

func drive(ctx context.Context, o options) (err error) {
	parent := o.dataParent
	if parent == "" {
		if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
			parent = "/dev/shm"
		}
	}
	dir, err := os.MkdirTemp(parent, "gwmembench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	bin := o.gatewayBin
	if bin == "" {
		bin = filepath.Join(dir, "gateway")
		build := exec.CommandContext(ctx, "go", "build", "-tags", "benchfarm", "-o", bin, "./cmd/gateway")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("build the gateway (run from the repository root): %w", err)
		}
	}

	eps, stopAgents, err := startAgents(ctx, o)
	defer stopAgents()
	if err != nil {
		return err
	}
	epFile := filepath.Join(dir, "endpoints.jsonl")
	if err := writeEndpoints(epFile, eps); err != nil {
		return err
	}
	pools := fmt.Sprintf(`{"pools": [{"name": "bench", "provider": "farm", "image": "host", "min_warm": %d, "max_total": %d,
		"default_lease_seconds": 3600, "max_lease_seconds": 3600, "startup_timeout_seconds": 600}]}`, o.n, o.n)
	poolsFile := filepath.Join(dir, "pools.json")
	if err := os.WriteFile(poolsFile, []byte(pools), 0o600); err != nil {
		return err
	}

	gw, err := startGateway(ctx, o, bin, dir, poolsFile, epFile)
	if err != nil {
		return err
	}
	defer gw.stop()
	fmt.Printf("gateway pid %d on %s; %d agent endpoints in %d processes\n", gw.cmd.Process.Pid, gw.url, len(eps), o.agentProcs)

	hc := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: o.workers, MaxConnsPerHost: o.workers + 2}}
	c := client.New(gw.url, apiKey, client.WithHTTPClient(hc))
	res := &result{N: o.n, Conns: o.conns, AnswerBytes: o.answerBytes}
	var (
		ids  []string
		held []net.Conn
	)
	defer func() {
		for _, hc := range held {
			_ = hc.Close()
		}
	}()
	steps := []struct {
		name   string
		settle time.Duration // wait before the measurement
		do     func() error
	}{
		{"start", 0, func() error { return nil }},
		{"ready", 0, func() error { return waitReady(ctx, c, o.n) }},
		{"leased", 0, func() (err error) { ids, err = acquireAll(ctx, c, o); return err }},
		{"called", o.settle, func() error { return execAll(ctx, c, ids, o) }},
		{"connections", o.settle, func() (err error) {
			// The gateway must have the file descriptors for them: wait
			// until its agent connections are closed.
			waited, fds, err := gw.waitFDs(ctx, 20000-o.conns-1000, 2*time.Minute)
			if err != nil {
				return err
			}
			if waited > time.Second {
				note := fmt.Sprintf("waited %s for the gateway's open files to fall to %d before opening %d connections", waited.Round(time.Second), fds, o.conns)
				res.Notes = append(res.Notes, note)
				fmt.Println(note)
			}
			held, err = openIdle(ctx, gw.addr, ids, o)
			return err
		}},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			return fmt.Errorf("%s: %w", st.name, err)
		}
		if err := sleep(ctx, st.settle); err != nil {
			return err
		}
		cp, err := gw.measure(ctx, hc, st.name)
		if err != nil {
			return err
		}
		res.Checkpoints = append(res.Checkpoints, cp)
		printCheckpoint(cp)
		if o.profiles != "" {
			if err := gw.saveProfiles(ctx, o.profiles, st.name); err != nil {
				return err
			}
		}
	}
	alive, err := checkAlive(ctx, held)
	if err != nil {
		return err
	}
	note := fmt.Sprintf("%d of %d idle connections still served a request after the measurement", alive, len(held))
	res.Notes = append(res.Notes, note)
	fmt.Println(note)
	if alive != len(held) {
		err = errors.New(note)
	}

	res.PerItem = perItem(res.Checkpoints, o)
	printPerItem(res.PerItem)
	if o.out != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if werr := os.WriteFile(o.out, b, 0o644); werr != nil {
			return errors.Join(err, werr)
		}
	}
	return err
}

// startAgents starts the agent farm processes and returns their endpoints.
func startAgents(ctx context.Context, o options) ([]farm.Endpoint, func(), error) {
	self, err := os.Executable()
	if err != nil {
		return nil, func() {}, err
	}
	var (
		cmds []*exec.Cmd
		eps  []farm.Endpoint
	)
	stop := func() {
		for _, c := range cmds {
			_ = c.Process.Signal(syscall.SIGTERM)
		}
		for _, c := range cmds {
			_ = c.Wait()
		}
	}
	per := (o.n + o.agentProcs - 1) / o.agentProcs
	for first := 0; first < o.n; first += per {
		count := min(per, o.n-first)
		cmd := exec.CommandContext(ctx, self, "-role", "agents", "-first", strconv.Itoa(first), "-count", strconv.Itoa(count),
			"-answer-bytes", strconv.Itoa(o.answerBytes), "-addr-base", strconv.Itoa(o.addrBase), "-agent-port", strconv.Itoa(o.agentPort))
		cmd.Stderr = os.Stderr
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, stop, err
		}
		if err := cmd.Start(); err != nil {
			return nil, stop, fmt.Errorf("start agent farm: %w", err)
		}
		cmds = append(cmds, cmd)
		sc := bufio.NewScanner(out)
		ready := false
		for sc.Scan() {
			if sc.Text() == "ready" {
				ready = true
				break
			}
			var e farm.Endpoint
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				return nil, stop, fmt.Errorf("agent farm line %q: %w", sc.Text(), err)
			}
			eps = append(eps, e)
		}
		if !ready {
			return nil, stop, fmt.Errorf("agent farm %d..%d exited before it was ready", first, first+count)
		}
		go func() { _, _ = io.Copy(io.Discard, out) }()
	}
	return eps, stop, nil
}

func writeEndpoints(path string, eps []farm.Endpoint) error {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	for _, e := range eps {
		_ = enc.Encode(e)
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}

// gatewayProc is the gateway under measurement.
type gatewayProc struct {
	cmd     *exec.Cmd
	url     string
	addr    string
	started time.Time
	done    chan struct{}
	pprof   string // its pprof address, with -profiles
	cancel  context.CancelFunc
}

// saveProfiles saves the gateway's heap (after a GC) and goroutine profiles
// as dir/<name>.heap and dir/<name>.goroutines.txt.
func (g *gatewayProc) saveProfiles(ctx context.Context, dir, name string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for file, path := range map[string]string{name + ".heap": "/debug/pprof/heap?gc=1", name + ".goroutines.txt": "/debug/pprof/goroutine?debug=1"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.pprof+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return fmt.Errorf("profile: %w", err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, file), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

var servingLine = regexp.MustCompile(`serving on (http://(\S+))`)

func startGateway(ctx context.Context, o options, bin, dir, poolsFile, epFile string) (*gatewayProc, error) {
	pprofAddr := ""
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "QUARRY_") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"QUARRY_ADDR=127.0.0.1:0", "QUARRY_API_KEYS="+apiKey, "QUARRY_DATA_DIR="+filepath.Join(dir, "data"),
		"QUARRY_POOLS_FILE="+poolsFile, "QUARRY_PROVIDER=farm", "QUARRY_BENCH_FARM_ENDPOINTS="+epFile,
		"QUARRY_GATEWAY_ID=gwmembench", "QUARRY_LOG_LEVEL=warn",
		// The connections are held idle for the whole measurement.
		"QUARRY_IDLE_TIMEOUT=15m",
	)
	if o.profiles != "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		pprofAddr = ln.Addr().String()
		_ = ln.Close()
		env = append(env, "QUARRY_BENCH_PPROF_ADDR="+pprofAddr)
	}
	if o.gatewayEnv != "" {
		env = append(env, strings.Split(o.gatewayEnv, ",")...)
	}
	logf, err := os.Create(filepath.Join(dir, "gateway.log"))
	if err != nil {
		return nil, err
	}
	gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cmd := exec.CommandContext(gctx, bin)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	cmd.Env, cmd.Stderr = env, logf
	out, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		cancel()
		return nil, fmt.Errorf("start gateway: %w", err)
	}
	g := &gatewayProc{cmd: cmd, started: time.Now(), done: make(chan struct{}), pprof: pprofAddr, cancel: cancel}
	go func() { _ = cmd.Wait(); close(g.done); logf.Close() }()
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	select {
	case l := <-lines:
		m := servingLine.FindStringSubmatch(l)
		if m == nil {
			g.stop()
			return nil, fmt.Errorf("gateway said %q", l)
		}
		g.url, g.addr = m[1], m[2]
		return g, nil
	case <-g.done:
		g.cancel()
		b, _ := os.ReadFile(logf.Name())
		return nil, fmt.Errorf("gateway exited: %s", tail(string(b), 2000))
	case <-time.After(time.Minute):
		g.stop()
		return nil, errors.New("gateway did not start within a minute")
	case <-ctx.Done():
		g.stop()
		return nil, ctx.Err()
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// stop sends SIGTERM and waits for the exit (killed after 30 s).
func (g *gatewayProc) stop() {
	g.cancel()
	<-g.done
}

func (g *gatewayProc) measure(ctx context.Context, hc *http.Client, name string) (checkpoint, error) {
	cp := checkpoint{Name: name, Seconds: time.Since(g.started).Seconds(), Proc: map[string]int64{}, Metrics: map[string]float64{}}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", g.cmd.Process.Pid))
	if err != nil {
		return cp, fmt.Errorf("read the gateway's status: %w", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		for _, f := range procFields {
			if k == f {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				cp.Proc[f] = kb << 10
			}
		}
	}
	m, err := g.metrics(ctx, hc)
	if err != nil {
		return cp, err
	}
	for _, n := range metricNames {
		if v, ok := m[n]; ok {
			cp.Metrics[n] = v
		}
	}
	return cp, nil
}

func (g *gatewayProc) metrics(ctx context.Context, hc *http.Client) (map[string]float64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, g.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape /metrics: %w", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "#") || strings.Contains(l, "{") {
			continue
		}
		k, v, ok := strings.Cut(l, " ")
		if !ok {
			continue
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			out[k] = f
		}
	}
	return out, sc.Err()
}

// waitFDs waits until the gateway holds at most limit open files, up to max.
func (g *gatewayProc) waitFDs(ctx context.Context, limit int, max time.Duration) (time.Duration, int, error) {
	start := time.Now()
	for {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", g.cmd.Process.Pid))
		if err != nil {
			return 0, 0, err
		}
		if len(ents) <= limit || time.Since(start) >= max {
			return time.Since(start), len(ents), nil
		}
		if err := sleep(ctx, time.Second); err != nil {
			return 0, 0, err
		}
	}
}

func waitReady(ctx context.Context, c *client.Client, n int) error {
	start := time.Now()
	last := -1
	for {
		ps, err := c.Pools(ctx)
		if err != nil {
			return fmt.Errorf("pools: %w", err)
		}
		for _, p := range ps {
			if p.Name != "bench" {
				continue
			}
			if p.Ready >= n {
				fmt.Printf("pool ready: %d tasks in %s\n", p.Ready, time.Since(start).Round(time.Second))
				return nil
			}
			if p.Ready/1000 != last/1000 {
				fmt.Printf("  ready %d, launching %d (%s)\n", p.Ready, p.Launching, time.Since(start).Round(time.Second))
			}
			last = p.Ready
		}
		if err := sleep(ctx, time.Second); err != nil {
			return fmt.Errorf("wait for %d ready tasks (last %d): %w", n, last, err)
		}
	}
}

func acquireAll(ctx context.Context, c *client.Client, o options) ([]string, error) {
	ids := make([]string, o.n)
	start := time.Now()
	err := forEach(ctx, o.workers, o.n, func(ctx context.Context, i int) error {
		sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: "bench"})
		if err != nil {
			return err
		}
		ids[i] = sb.ID
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("acquire: %w", err)
	}
	fmt.Printf("acquired %d leases in %s\n", o.n, time.Since(start).Round(time.Second))
	return ids, nil
}

// execAll makes one exec call on every lease, over o.workers connections.
func execAll(ctx context.Context, c *client.Client, ids []string, o options) error {
	return forEach(ctx, o.workers, len(ids), func(ctx context.Context, i int) error {
		r, err := c.Exec(ctx, ids[i], agentapi.ExecRequest{Command: "true"})
		if err == nil && len(r.Stdout) != o.answerBytes {
			err = fmt.Errorf("exec answer of %d bytes, want %d", len(r.Stdout), o.answerBytes)
		}
		return err
	})
}

// forEach runs fn for 0..n-1 on at most workers goroutines; the first error
// stops it.
func forEach(ctx context.Context, workers, n int, fn func(ctx context.Context, i int) error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for i := range n {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error { return fn(gctx, i) })
	}
	return g.Wait()
}

// openIdle opens o.conns connections to the gateway at o.rate a second;
// each makes one exec call on lease ids[i%len(ids)], reads the whole answer
// and is kept open.
func openIdle(ctx context.Context, addr string, ids []string, o options) ([]net.Conn, error) {
	held := make([]net.Conn, o.conns)
	body := `{"command":"true"}`
	tick := time.NewTicker(time.Second / time.Duration(o.rate))
	defer tick.Stop()
	start := time.Now()
	var done atomic.Int64
	err := func() error {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(64)
		for i := range o.conns {
			select {
			case <-gctx.Done():
				return g.Wait()
			case <-tick.C:
			}
			g.Go(func() error {
				d := net.Dialer{Timeout: 10 * time.Second}
				conn, err := d.DialContext(gctx, "tcp", addr)
				if err != nil {
					return fmt.Errorf("connection %d: %w", i, err)
				}
				held[i] = conn
				req := fmt.Sprintf("POST /v1/sandboxes/%s/exec HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
					ids[i%len(ids)], addr, apiKey, len(body), body)
				if err := roundTrip(conn, req, o.answerBytes); err != nil {
					return fmt.Errorf("connection %d: %w", i, err)
				}
				if n := done.Add(1); n%2000 == 0 {
					fmt.Printf("  %d connections open and idle (%s)\n", n, time.Since(start).Round(time.Second))
				}
				return nil
			})
		}
		return g.Wait()
	}()
	var out []net.Conn
	for _, c := range held {
		if c != nil {
			out = append(out, c)
		}
	}
	if err != nil {
		return out, fmt.Errorf("open idle connections: %w", err)
	}
	fmt.Printf("opened %d idle connections in %s\n", len(out), time.Since(start).Round(time.Second))
	return out, nil
}

// roundTrip writes req on conn and reads its whole answer, which must be a
// 200 with at least minBody bytes; nothing stays buffered, so the
// connection can be reused raw.
func roundTrip(conn net.Conn, req string, minBody int) error {
	_ = conn.SetDeadline(time.Now().Add(time.Minute))
	defer conn.SetDeadline(time.Time{})
	if _, err := io.WriteString(conn, req); err != nil {
		return err
	}
	br := bufio.NewReaderSize(conn, 4096)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return err
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || n < int64(minBody) || resp.Close {
		return fmt.Errorf("answer %d of %d bytes (close %v)", resp.StatusCode, n, resp.Close)
	}
	if br.Buffered() != 0 {
		return errors.New("bytes after the answer")
	}
	return nil
}

// checkAlive makes one GET /healthz on every held connection.
func checkAlive(ctx context.Context, held []net.Conn) (int, error) {
	var alive atomic.Int64
	var mu sync.Mutex
	var firstErr error
	err := forEach(ctx, 64, len(held), func(_ context.Context, i int) error {
		err := roundTrip(held[i], "GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n", 1)
		if err == nil {
			alive.Add(1)
		} else {
			mu.Lock()
			if firstErr == nil {
				firstErr = fmt.Errorf("connection %d: %w", i, err)
			}
			mu.Unlock()
		}
		return nil
	})
	if firstErr != nil {
		fmt.Println("first dead connection:", firstErr)
	}
	return int(alive.Load()), err
}

// sleep waits for d; it returns ctx's error when ctx ends first.
func sleep(ctx context.Context, d time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	<-wctx.Done()
	return ctx.Err()
}

func printCheckpoint(cp checkpoint) {
	mb := func(v int64) string { return fmt.Sprintf("%.1f MB", float64(v)/1e6) }
	fmt.Printf("%-12s t=%5.0fs  VmRSS %-9s (anon %s, file %s, shmem %s)  VmHWM %-9s  heap in use %.1f MB  stacks %.1f MB  goroutines %.0f  open files %.0f  agent clients %.0f\n",
		cp.Name, cp.Seconds, mb(cp.Proc["VmRSS"]), mb(cp.Proc["RssAnon"]), mb(cp.Proc["RssFile"]), mb(cp.Proc["RssShmem"]), mb(cp.Proc["VmHWM"]),
		cp.Metrics["go_memstats_heap_inuse_bytes"]/1e6, cp.Metrics["go_memstats_stack_inuse_bytes"]/1e6,
		cp.Metrics["go_goroutines"], cp.Metrics["process_open_fds"], cp.Metrics["quarry_gateway_agent_clients"])
}

// perItem derives per-lease and per-connection costs from the checkpoints.
func perItem(cps []checkpoint, o options) map[string]float64 {
	by := map[string]checkpoint{}
	for _, cp := range cps {
		by[cp.Name] = cp
	}
	out := map[string]float64{}
	diff := func(key, from, to string, n int) {
		if n <= 0 {
			return
		}
		a, b := by[from], by[to]
		out[key+"_rss"] = float64(b.Proc["VmRSS"]-a.Proc["VmRSS"]) / float64(n)
		out[key+"_rss_anon"] = float64(b.Proc["RssAnon"]-a.Proc["RssAnon"]) / float64(n)
		out[key+"_heap"] = (b.Metrics["go_memstats_heap_inuse_bytes"] - a.Metrics["go_memstats_heap_inuse_bytes"]) / float64(n)
		out[key+"_stack"] = (b.Metrics["go_memstats_stack_inuse_bytes"] - a.Metrics["go_memstats_stack_inuse_bytes"]) / float64(n)
	}
	diff("ready_task", "start", "ready", o.n)
	diff("lease", "ready", "leased", o.n)
	diff("agent_client", "leased", "called", o.n)
	diff("connection", "called", "connections", o.conns)
	out["total_rss"] = float64(by["connections"].Proc["VmRSS"])
	out["peak_rss"] = float64(by["connections"].Proc["VmHWM"])
	return out
}

func printPerItem(m map[string]float64) {
	fmt.Println("per item (bytes; RSS, anonymous RSS, Go heap in use, goroutine stacks):")
	for _, k := range []string{"ready_task", "lease", "agent_client", "connection"} {
		fmt.Printf("  %-13s RSS %7.0f  anon %7.0f  heap %7.0f  stack %7.0f\n", k, m[k+"_rss"], m[k+"_rss_anon"], m[k+"_heap"], m[k+"_stack"])
	}
	fmt.Printf("gateway VmRSS at the end %.1f MB (goal ≤ 512 MB), peak %.1f MB\n", m["total_rss"]/1e6, m["peak_rss"]/1e6)
}
