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
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	dockerclient "github.com/docker/docker/client"

	"github.com/quarryhq/quarry/bench/internal/dockergw"
	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
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
	cli, gwID, done, err := dockergw.Engine("dockerbench")
	if err != nil {
		return err
	}
	defer done()

	res := results{Image: o.image, ColdRuns: o.coldRuns, WarmRuns: o.warmRuns, ChurnRuns: o.churnRuns}
	fmt.Printf("image %s, gateway id %s\n\n", o.image, gwID)

	cold, plain, err := coldStarts(ctx, o, bin, gwID)
	if err != nil {
		return fmt.Errorf("cold starts: %w", err)
	}
	res.ColdMS, res.DockerRunMS = dockergw.Summary(cold), dockergw.Summary(plain)
	fmt.Printf("cold create -> first exec (provider)   %s\n", dockergw.Line(cold))
	fmt.Printf("plain docker run --rm IMAGE true        %s\n", dockergw.Line(plain))
	fmt.Printf("ratio of p50s: %.2f\n\n", res.ColdMS["p50"]/res.DockerRunMS["p50"])

	g, err := startGateway(ctx, o, bin, gwID)
	if err != nil {
		return err
	}
	defer g.Stop()

	warm, err := warmAcquires(ctx, o, g, o.warmRuns, true)
	if err != nil {
		return fmt.Errorf("warm acquires: %w", err)
	}
	res.WarmMS = dockergw.Summary(warm)
	fmt.Printf("warm acquire -> first exec, quiet pool  %s\n", dockergw.Line(warm))
	churn, err := warmAcquires(ctx, o, g, o.churnRuns, false)
	if err != nil {
		return fmt.Errorf("warm acquires during refill: %w", err)
	}
	res.ChurnMS = dockergw.Summary(churn)
	fmt.Printf("warm acquire -> first exec, refilling   %s\n\n", dockergw.Line(churn))

	if !o.skipPool {
		burst, total, refill, launched, err := burstAndRefill(ctx, o, g, cli, gwID)
		if err != nil {
			return fmt.Errorf("burst and refill: %w", err)
		}
		res.PoolSize, res.BurstMS, res.BurstTotalMS = o.poolSize, dockergw.Summary(burst), dockergw.MS(total)
		res.RefillMS, res.RefillLaunched = dockergw.MS(refill), launched
		fmt.Printf("burst of %d acquires -> first exec      %s, all done in %s\n", o.poolSize, dockergw.Line(burst), total.Round(time.Millisecond))
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
type gateway struct{ *dockergw.Gateway }

const benchPool = "bench"

func startGateway(ctx context.Context, o options, bin, gwID string) (*gateway, error) {
	dir, err := os.MkdirTemp("", "dockerbench-gw-")
	if err != nil {
		return nil, err
	}
	size := max(o.poolSize, 2)
	pools := fmt.Sprintf("pools:\n  - name: %s\n    image: %s\n    cpu: 1\n    memory: 256Mi\n    min_warm: %d\n    max_total: %d\n",
		benchPool, o.image, size, 2*size)
	gw, err := dockergw.Start(dockergw.Options{Bin: bin, Dir: dir, Key: benchKey, GatewayID: gwID, Pools: pools})
	if err != nil {
		return nil, err
	}
	g := &gateway{gw}
	if err := g.waitReady(ctx, size, false, o.waitLimit); err != nil {
		log := g.LogTail() // before Stop removes dir
		g.Stop()
		return nil, fmt.Errorf("%w; gateway log:\n%s", err, log)
	}
	return g, nil
}

// waitReady waits until the pool has n ready tasks (and, if idle, none launching or
// stopping).
func (g *gateway) waitReady(ctx context.Context, n int, idle bool, limit time.Duration) error {
	return g.WaitPool(ctx, benchPool, limit, func(p client.Pool) bool {
		return p.Ready >= n && (!idle || p.Launching == 0 && p.Stopping == 0)
	})
}

// acquireExec creates a sandbox, runs its first command and releases it; it returns the
// time from the create request to the command's answer.
func (g *gateway) acquireExec(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	sbx, err := g.C.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: benchPool})
	if err != nil {
		return 0, err
	}
	_, err = g.C.Exec(ctx, sbx.ID, agentapi.ExecRequest{Command: "true"})
	took := time.Since(start)
	if _, rerr := g.C.DeleteSandbox(ctx, sbx.ID); err == nil {
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
	before, err := dockergw.ContainerIDs(ctx, cli, gwID)
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
	after, err := dockergw.ContainerIDs(ctx, cli, gwID)
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
