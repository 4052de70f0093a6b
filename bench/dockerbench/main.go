// Command dockerbench measures the Docker provider against a real engine, on loopback:
//
//  1. cold: provider Launch -> agent healthy -> first exec, p50/p99, beside plain
//     `docker run --rm IMAGE true` of the same image, alternated in the same run;
//  2. warm: a gateway (bin/gateway, QUARRY_PROVIDER=docker) acquire -> first exec, p50/p99,
//     one sandbox at a time: "quiet" waits before each acquire until the pool is full and
//     idle (the acquire path alone); "churn" only until one task is ready, so the refill
//     launches and removals of earlier acquires run on the same cores;
//  3. refill: a pool of 50 warm containers, a burst of 50 concurrent acquires (each
//     acquire -> first exec timed), and the time until 50 are ready again.
//
// It needs a Docker engine (scripts/docker-up.sh) and the test images
// (scripts/images/build.sh). `make bench` runs it; every container it starts carries its own
// gateway id and is removed at the end.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	dockertypes "github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	dockerclient "github.com/docker/docker/client"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/stats"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/providers/docker"
)

// benchKey is the gateway's API key (at least 16 characters).
const benchKey = "dockerbench-key-0123456789"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "dockerbench:", err)
		os.Exit(1)
	}
}

type options struct {
	bin       string
	image     string
	out       string
	coldRuns  int
	warmRuns  int
	churnRuns int
	poolSize  int
	skipPool  bool
	waitLimit time.Duration
}

// results is what -json writes.
type results struct {
	Image          string             `json:"image"`
	ColdRuns       int                `json:"cold_runs"`
	ColdMS         map[string]float64 `json:"cold_create_to_first_exec_ms"`
	DockerRunMS    map[string]float64 `json:"docker_run_rm_true_ms"`
	WarmRuns       int                `json:"warm_runs"`
	WarmMS         map[string]float64 `json:"warm_acquire_to_first_exec_ms"`
	ChurnRuns      int                `json:"churn_runs"`
	ChurnMS        map[string]float64 `json:"warm_acquire_to_first_exec_during_refill_ms"`
	PoolSize       int                `json:"pool_size,omitempty"`
	BurstMS        map[string]float64 `json:"burst_acquire_to_first_exec_ms,omitempty"`
	BurstTotalMS   float64            `json:"burst_total_ms,omitempty"`
	RefillMS       float64            `json:"refill_to_pool_size_ms,omitempty"`
	RefillLaunched int                `json:"refill_containers_launched,omitempty"`
}

func run(ctx context.Context) error {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory with the gateway and execagent binaries")
	flag.StringVar(&o.image, "image", "quarry-test/busybox:latest", "image of the sandboxes")
	flag.StringVar(&o.out, "json", "", "write the results as JSON to this file")
	flag.IntVar(&o.coldRuns, "cold", 20, "cold starts (and as many plain docker runs)")
	flag.IntVar(&o.warmRuns, "warm", 60, "warm acquires, each with the pool full and idle")
	flag.IntVar(&o.churnRuns, "churn", 60, "warm acquires while the pool refills")
	flag.IntVar(&o.poolSize, "pool", 50, "warm pool size of the burst and refill measurement")
	flag.BoolVar(&o.skipPool, "skip-pool", false, "skip the burst and refill measurement")
	flag.DurationVar(&o.waitLimit, "wait", 5*time.Minute, "bound of each wait (a pool filling, an agent answering)")
	flag.Parse()

	bin, err := filepath.Abs(o.bin)
	if err != nil {
		return err
	}
	gwID := "bench-" + randomHex(5)
	cli, err := dockerclient.NewClientWithOpts(dockerclient.WithHost(docker.DefaultHost), dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		return err
	}
	defer cli.Close()
	defer removeAll(cli, gwID)

	res := results{Image: o.image, ColdRuns: o.coldRuns, WarmRuns: o.warmRuns, ChurnRuns: o.churnRuns}
	fmt.Printf("image %s, gateway id %s\n\n", o.image, gwID)

	cold, plain, err := coldStarts(ctx, o, bin, gwID)
	if err != nil {
		return fmt.Errorf("cold starts: %w", err)
	}
	res.ColdMS, res.DockerRunMS = summary(cold), summary(plain)
	fmt.Printf("cold create -> first exec (provider)   %s\n", line(cold))
	fmt.Printf("plain docker run --rm IMAGE true        %s\n", line(plain))
	fmt.Printf("ratio of p50s: %.2f\n\n", res.ColdMS["p50"]/res.DockerRunMS["p50"])

	g, err := startGateway(ctx, o, bin, gwID)
	if err != nil {
		return err
	}
	defer g.stop()

	warm, err := warmAcquires(ctx, o, g, o.warmRuns, true)
	if err != nil {
		return fmt.Errorf("warm acquires: %w", err)
	}
	res.WarmMS = summary(warm)
	fmt.Printf("warm acquire -> first exec, quiet pool  %s\n", line(warm))
	churn, err := warmAcquires(ctx, o, g, o.churnRuns, false)
	if err != nil {
		return fmt.Errorf("warm acquires during refill: %w", err)
	}
	res.ChurnMS = summary(churn)
	fmt.Printf("warm acquire -> first exec, refilling   %s\n\n", line(churn))

	if !o.skipPool {
		burst, total, refill, launched, err := burstAndRefill(ctx, o, g, cli, gwID)
		if err != nil {
			return fmt.Errorf("burst and refill: %w", err)
		}
		res.PoolSize, res.BurstMS, res.BurstTotalMS = o.poolSize, summary(burst), ms(total)
		res.RefillMS, res.RefillLaunched = ms(refill), launched
		fmt.Printf("burst of %d acquires -> first exec      %s, all done in %s\n", o.poolSize, line(burst), total.Round(time.Millisecond))
		fmt.Printf("refill to %d ready after the burst      %s (%d containers launched)\n", o.poolSize, refill.Round(time.Millisecond), launched)
	}
	if o.out != "" {
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.out, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// coldStarts alternates a provider cold start (Launch, /healthz, first exec, Stop) with a
// plain `docker run --rm IMAGE true`, so both see the same machine.
func coldStarts(ctx context.Context, o options, bin, gwID string) (cold, plain []time.Duration, err error) {
	dir, err := os.MkdirTemp("", "dockerbench-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	p, err := docker.New(docker.Config{
		AgentBinary: filepath.Join(bin, "execagent"), GatewayID: gwID, TokenKeyFile: filepath.Join(dir, "token.key"),
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, nil, err
	}
	defer p.Close(ctx)
	spec := providers.Spec{Pool: "cold", Image: o.image, CPU: 1, MemoryMB: 256}
	hc := &http.Client{Timeout: 10 * time.Second}
	for i := range o.coldRuns {
		start := time.Now()
		tasks, err := p.Launch(ctx, spec, []string{fmt.Sprintf("%s-cold-%d", gwID, i)})
		if err != nil {
			return nil, nil, err
		}
		a := agentapi.New(tasks[0].AgentURL, tasks[0].AgentToken, hc)
		if err := firstExec(ctx, o.waitLimit, func(c context.Context) error {
			_, err := a.Exec(c, agentapi.ExecRequest{Command: "true"})
			return err
		}); err != nil {
			return nil, nil, err
		}
		cold = append(cold, time.Since(start))
		if err := p.Stop(ctx, tasks[0].ID, "bench"); err != nil {
			return nil, nil, err
		}

		start = time.Now()
		out, err := exec.CommandContext(ctx, "docker", "run", "--rm", o.image, "true").CombinedOutput()
		if err != nil {
			return nil, nil, fmt.Errorf("docker run: %w: %s", err, out)
		}
		plain = append(plain, time.Since(start))
	}
	return cold, plain, nil
}

// firstExec retries f (the agent may not listen yet) every 2 ms until it succeeds.
func firstExec(ctx context.Context, limit time.Duration, f func(context.Context) error) error {
	deadline := time.Now().Add(limit)
	for {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := f(c)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("first exec: %w", err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// gateway is a bin/gateway process on the Docker provider.
type gateway struct {
	cmd  *exec.Cmd
	done chan struct{}
	c    *client.Client
	dir  string
}

const benchPool = "bench"

func startGateway(ctx context.Context, o options, bin, gwID string) (*gateway, error) {
	dir, err := os.MkdirTemp("", "dockerbench-gw-")
	if err != nil {
		return nil, err
	}
	size := max(o.poolSize, 2)
	pools := fmt.Sprintf("pools:\n  - name: %s\n    image: %s\n    cpu: 1\n    memory: 256Mi\n    min_warm: %d\n    max_total: %d\n",
		benchPool, o.image, size, 2*size)
	if err := os.WriteFile(filepath.Join(dir, "pools.yaml"), []byte(pools), 0o644); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	_ = l.Close()
	logf, err := os.Create(filepath.Join(dir, "gateway.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(bin, "gateway"))
	cmd.Env = append(os.Environ(),
		"QUARRY_ADDR="+addr, "QUARRY_API_KEYS="+benchKey, "QUARRY_DATA_DIR="+dir,
		"QUARRY_POOLS_FILE="+filepath.Join(dir, "pools.yaml"), "QUARRY_PROVIDER=docker",
		"QUARRY_AGENT_BINARY="+filepath.Join(bin, "execagent"), "QUARRY_GATEWAY_ID="+gwID,
		"QUARRY_LOG_LEVEL=warn",
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	g := &gateway{cmd: cmd, done: make(chan struct{}), c: client.New("http://"+addr, benchKey), dir: dir}
	go func() { _ = cmd.Wait(); close(g.done) }()
	if err := g.waitReady(ctx, size, false, o.waitLimit); err != nil {
		b, _ := os.ReadFile(filepath.Join(dir, "gateway.log")) // before stop removes dir
		g.stop()
		return nil, fmt.Errorf("%w; gateway log:\n%s", err, tail(b, 4<<10))
	}
	return g, nil
}

func (g *gateway) stop() {
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(30 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.done
	}
	_ = os.RemoveAll(g.dir)
}

// waitReady waits until the pool has n ready tasks (and, if idle, none launching or
// stopping).
func (g *gateway) waitReady(ctx context.Context, n int, idle bool, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		select {
		case <-g.done:
			return errors.New("the gateway exited")
		default:
		}
		ps, err := g.c.Pools(ctx)
		if err == nil {
			for _, p := range ps {
				if p.Name == benchPool && p.Ready >= n && (!idle || p.Launching == 0 && p.Stopping == 0) {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pool %s: %d ready tasks not reached within %s (last error %v)", benchPool, n, limit, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// acquireExec creates a sandbox, runs its first command and releases it; it returns the
// time from the create request to the command's answer.
func (g *gateway) acquireExec(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	sbx, err := g.c.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: benchPool})
	if err != nil {
		return 0, err
	}
	_, err = g.c.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "true"})
	took := time.Since(start)
	if _, rerr := g.c.DeleteSandbox(ctx, sbx.ID); err == nil {
		err = rerr
	}
	return took, err
}

// warmAcquires times n acquires one at a time, each with a ready task waiting: with
// quiet, the pool is full and idle first.
func warmAcquires(ctx context.Context, o options, g *gateway, n int, quiet bool) ([]time.Duration, error) {
	size := max(o.poolSize, 2)
	var out []time.Duration
	for range n {
		want := 1
		if quiet {
			want = size
		}
		if err := g.waitReady(ctx, want, quiet, o.waitLimit); err != nil {
			return nil, err
		}
		d, err := g.acquireExec(ctx)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// burstAndRefill waits for a full pool, acquires poolSize sandboxes at once, and times the
// refill back to poolSize ready tasks.
func burstAndRefill(ctx context.Context, o options, g *gateway, cli *dockerclient.Client, gwID string) (burst []time.Duration, total, refill time.Duration, launched int, err error) {
	if err := g.waitReady(ctx, o.poolSize, true, o.waitLimit); err != nil {
		return nil, 0, 0, 0, err
	}
	before, err := containerIDs(ctx, cli, gwID)
	if err != nil {
		return nil, 0, 0, 0, err
	}
	durs := make([]time.Duration, o.poolSize)
	errs := make([]error, o.poolSize)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range o.poolSize {
		wg.Go(func() { durs[i], errs[i] = g.acquireExec(ctx) })
	}
	wg.Wait()
	total = time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return nil, 0, 0, 0, err
	}
	if err := g.waitReady(ctx, o.poolSize, false, o.waitLimit); err != nil {
		return nil, 0, 0, 0, err
	}
	refill = time.Since(start)
	after, err := containerIDs(ctx, cli, gwID)
	if err != nil {
		return nil, 0, 0, 0, err
	}
	for id := range after {
		if !before[id] {
			launched++
		}
	}
	return durs, total, refill, launched, nil
}

func containerIDs(ctx context.Context, cli *dockerclient.Client, gwID string) (map[string]bool, error) {
	list, err := cli.ContainerList(ctx, dockertypes.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", providers.LabelGateway+"="+gwID))})
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(list))
	for _, c := range list {
		out[c.ID] = true
	}
	return out, nil
}

// removeAll removes every container of the benchmark's gateway id.
func removeAll(cli *dockerclient.Client, gwID string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ids, err := containerIDs(ctx, cli, gwID)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dockerbench: clean up:", err)
		return
	}
	for id := range ids {
		if err := cli.ContainerRemove(ctx, id, dockertypes.RemoveOptions{Force: true}); err != nil {
			fmt.Fprintln(os.Stderr, "dockerbench: clean up:", err)
		}
	}
}

func summary(ds []time.Duration) map[string]float64 {
	return map[string]float64{"p50": ms(stats.Percentile(ds, 50)), "p99": ms(stats.Percentile(ds, 99)), "min": ms(stats.Percentile(ds, 0)), "max": ms(stats.Percentile(ds, 100))}
}

func line(ds []time.Duration) string {
	return fmt.Sprintf("n=%d p50 %s p99 %s (min %s, max %s)", len(ds), stats.Percentile(ds, 50).Round(100*time.Microsecond),
		stats.Percentile(ds, 99).Round(100*time.Microsecond), stats.Percentile(ds, 0).Round(100*time.Microsecond), stats.Percentile(ds, 100).Round(100*time.Microsecond))
}

// pct returns the p-th percentile (nearest rank) of ds.

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
