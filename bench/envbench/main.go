// Command envbench measures the env API (docs/ENVS.md) on loopback with a
// real gateway (bin/gateway, process provider, embedded store) and real
// agents, running examples/envs/terminal_task.py:
//
//  1. one client: episodes of make, reset, 20 steps, close; step p50/p99,
//     steps per second while stepping and over the whole episode loop;
//  2. -clients concurrent clients (64), each on its own sandbox running
//     -client-episodes such episodes: steps per second over the whole run,
//     step p50/p99;
//  3. overhead: the same command ("echo hi") as an env step, as a session
//     run and as a one-shot exec in the same sandbox, interleaved; p50/p99
//     of each and the step's extra time over the session run. (An env step
//     of the terminal task spawns one bash per command, as exec does; a
//     session reuses its shell.)
//
// `make bench` runs it after building bin/; the gateway's data directory is
// a temporary directory removed at the end, and every sandbox is stopped.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/quarryhq/quarry/bench/internal/procgw"
	"github.com/quarryhq/quarry/envs/envclient"
	"github.com/quarryhq/quarry/internal/stats"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "envbench:", err)
		os.Exit(1)
	}
}

type options struct {
	bin            string
	examples       string
	episodes       int
	clients        int
	clientEpisodes int
	steps          int
	overheadCalls  int
	out            string
}

// result is one measured line.
type result struct {
	Name   string             `json:"name"`
	Values map[string]float64 `json:"values"`
	Note   string             `json:"note,omitempty"`
}

const (
	benchKey = "envbench-api-key-0123456789"
	action   = "echo hi"
	envID    = "terminal"
)

func run(ctx context.Context) error {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory with the gateway and execagent binaries")
	flag.StringVar(&o.examples, "examples", "examples/envs", "directory of the example envs")
	flag.IntVar(&o.episodes, "episodes", 20, "episodes of the one-client loop")
	flag.IntVar(&o.clients, "clients", 64, "concurrent clients, one sandbox each")
	flag.IntVar(&o.clientEpisodes, "client-episodes", 3, "episodes per concurrent client")
	flag.IntVar(&o.steps, "steps", 20, "steps per episode")
	flag.IntVar(&o.overheadCalls, "overhead-calls", 300, "calls of each kind in the overhead comparison")
	flag.StringVar(&o.out, "json", "", "write results as JSON to this file")
	flag.Parse()
	if o.episodes < 1 || o.clients < 1 || o.clientEpisodes < 1 || o.steps < 1 || o.overheadCalls < 1 {
		return errors.New("-episodes, -clients, -client-episodes, -steps and -overhead-calls must be positive")
	}

	g, err := startGateway(ctx, o)
	if err != nil {
		return err
	}
	defer g.Stop()
	hc := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: o.clients + 8}}
	c := envclient.New(g.Base, benchKey, hc)
	if err := g.WaitReady(ctx, o.clients); err != nil {
		return err
	}

	var results []result
	r, err := oneClient(ctx, c, o)
	if err != nil {
		return fmt.Errorf("one client: %w", err)
	}
	results = append(results, r)
	if err := g.WaitReady(ctx, o.clients); err != nil {
		return err
	}
	r, err = manyClients(ctx, c, o)
	if err != nil {
		return fmt.Errorf("%d clients: %w", o.clients, err)
	}
	results = append(results, r)
	r, err = overhead(ctx, c, g, hc, o)
	if err != nil {
		return fmt.Errorf("overhead: %w", err)
	}
	results = append(results, r)

	for _, r := range results {
		fmt.Printf("%-28s", r.Name)
		for _, k := range sortedKeys(r.Values) {
			fmt.Printf(" %s=%.2f", k, r.Values[k])
		}
		fmt.Println()
		if r.Note != "" {
			fmt.Printf("%28s %s\n", "", r.Note)
		}
	}
	if o.out != "" {
		b, _ := json.MarshalIndent(results, "", "  ")
		if err := os.WriteFile(o.out, b, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", o.out, err)
		}
	}
	return nil
}

// episode runs make, reset, steps, close and returns the step latencies.
func episode(ctx context.Context, c *envclient.Client, steps int, seed int64) ([]time.Duration, error) {
	id, err := c.Make(ctx, envID)
	if err != nil {
		return nil, fmt.Errorf("make: %w", err)
	}
	defer func() { _ = c.Close(context.WithoutCancel(ctx), id) }()
	if _, err := c.Reset(ctx, id, &seed, map[string]any{"max_steps": steps + 1}); err != nil {
		return nil, fmt.Errorf("reset: %w", err)
	}
	lat := make([]time.Duration, 0, steps)
	for range steps {
		start := time.Now()
		st, err := c.Step(ctx, id, action)
		if err != nil {
			return lat, fmt.Errorf("step: %w", err)
		}
		lat = append(lat, time.Since(start))
		if st.Terminated || st.Truncated {
			return lat, errors.New("the episode ended early")
		}
	}
	return lat, nil
}

func oneClient(ctx context.Context, c *envclient.Client, o options) (result, error) {
	var all []time.Duration
	start := time.Now()
	for i := range o.episodes {
		lat, err := episode(ctx, c, o.steps, int64(i))
		if err != nil {
			return result{}, err
		}
		all = append(all, lat...)
	}
	wall := time.Since(start)
	var stepping time.Duration
	for _, d := range all {
		stepping += d
	}
	return result{
		Name: "env_one_client",
		Values: map[string]float64{
			"step_p50_ms": ms(stats.Percentile(all, 50)), "step_p99_ms": ms(stats.Percentile(all, 99)),
			"steps_per_s_stepping": float64(len(all)) / stepping.Seconds(),
			"steps_per_s_loop":     float64(len(all)) / wall.Seconds(),
			"episode_ms":           ms(wall) / float64(o.episodes),
		},
		Note: fmt.Sprintf("%d episodes of make, reset, %d steps (%q), close; loop = steps over the whole wall time", o.episodes, o.steps, action),
	}, nil
}

func manyClients(ctx context.Context, c *envclient.Client, o options) (result, error) {
	var (
		mu  sync.Mutex
		all []time.Duration
	)
	eg, ectx := errgroup.WithContext(ctx)
	start := time.Now()
	for i := range o.clients {
		eg.Go(func() error {
			for e := range o.clientEpisodes {
				lat, err := episode(ectx, c, o.steps, int64(i*1000+e))
				mu.Lock()
				all = append(all, lat...)
				mu.Unlock()
				if err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := eg.Wait(); err != nil {
		return result{}, err
	}
	wall := time.Since(start)
	return result{
		Name: fmt.Sprintf("env_%d_clients", o.clients),
		Values: map[string]float64{
			"step_p50_ms": ms(stats.Percentile(all, 50)), "step_p99_ms": ms(stats.Percentile(all, 99)),
			"steps_per_s": float64(len(all)) / wall.Seconds(),
			"wall_s":      wall.Seconds(),
		},
		Note: fmt.Sprintf("%d clients x %d episodes (make, reset, %d steps, close); steps/s over the whole wall time", o.clients, o.clientEpisodes, o.steps),
	}, nil
}

func overhead(ctx context.Context, c *envclient.Client, g *procgw.Gateway, hc *http.Client, o options) (result, error) {
	id, err := c.Make(ctx, envID)
	if err != nil {
		return result{}, fmt.Errorf("make: %w", err)
	}
	defer func() { _ = c.Close(context.WithoutCancel(ctx), id) }()
	if _, err := c.Reset(ctx, id, nil, map[string]any{"max_steps": o.overheadCalls + 10}); err != nil {
		return result{}, fmt.Errorf("reset: %w", err)
	}
	api := envclient.New(g.Base, benchKey, hc)
	var ses struct {
		ID string `json:"id"`
	}
	if err := api.Do(ctx, "/v1/sandboxes/"+id+"/sessions", map[string]any{}, &ses); err != nil {
		return result{}, fmt.Errorf("create session: %w", err)
	}
	var step, session, oneShot []time.Duration
	timed := func(into *[]time.Duration, f func() error) error {
		start := time.Now()
		if err := f(); err != nil {
			return err
		}
		*into = append(*into, time.Since(start))
		return nil
	}
	for range o.overheadCalls {
		if err := timed(&step, func() error { _, err := c.Step(ctx, id, action); return err }); err != nil {
			return result{}, fmt.Errorf("step: %w", err)
		}
		if err := timed(&session, func() error {
			return api.Do(ctx, "/v1/sandboxes/"+id+"/sessions/"+ses.ID+"/run", map[string]any{"command": action}, nil)
		}); err != nil {
			return result{}, fmt.Errorf("session run: %w", err)
		}
		if err := timed(&oneShot, func() error {
			return api.Do(ctx, "/v1/sandboxes/"+id+"/exec", map[string]any{"command": action}, nil)
		}); err != nil {
			return result{}, fmt.Errorf("exec: %w", err)
		}
	}
	p50 := func(ds []time.Duration) float64 { return ms(stats.Percentile(ds, 50)) }
	p99 := func(ds []time.Duration) float64 { return ms(stats.Percentile(ds, 99)) }
	return result{
		Name: "env_step_vs_session",
		Values: map[string]float64{
			"step_p50_ms": p50(step), "step_p99_ms": p99(step),
			"session_p50_ms": p50(session), "session_p99_ms": p99(session),
			"exec_p50_ms": p50(oneShot), "exec_p99_ms": p99(oneShot),
			"step_over_session_p50_ms": p50(step) - p50(session),
			"step_over_exec_p50_ms":    p50(step) - p50(oneShot),
		},
		Note: fmt.Sprintf("%d interleaved calls of each; the same command %q through the gateway", o.overheadCalls, action),
	}, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func sortedKeys(m map[string]float64) []string {
	return slices.Sorted(maps.Keys(m))
}

// startGateway starts bin/gateway (bench/internal/procgw) with one process
// pool of o.clients warm sandboxes and the terminal env.
func startGateway(ctx context.Context, o options) (*procgw.Gateway, error) {
	examples, err := filepath.Abs(o.examples)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(examples, "terminal_task.py")); err != nil {
		return nil, fmt.Errorf("-examples: %w", err)
	}
	pools := fmt.Sprintf("pools:\n  - name: env\n    image: host\n    min_warm: %d\n    max_total: %d\n", o.clients, 2*o.clients+8)
	registry := fmt.Sprintf("envs:\n  - id: %s\n    pool: env\n    command: [python3, %s]\n", envID, filepath.Join(examples, "terminal_task.py"))
	return procgw.Start(ctx, procgw.Options{Bin: o.bin, Key: benchKey, Pools: pools,
		Files: map[string]string{"QUARRY_ENVS_FILE": registry}})
}
