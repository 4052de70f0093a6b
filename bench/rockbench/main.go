// Command rockbench measures ROCK's unmodified SDK (rl-rock) on Quarry with
// the gateway's hold of a nohup job's "kill -0" checks on (the default,
// QUARRY_ROCK_POLL_HOLD=8s) and off, side by side in one run
// (docs/ROCK.md, docs/BENCHMARKS.md "ROCK's SDK"):
//
//  1. a nohup arun of `true`, and of `sleep 0.2; echo done` (process
//     provider): p50/p99 with the hold on and off;
//  2. one anti_call_llm turn of ROCK's ModelService in a Docker sandbox of
//     quarry-test/python, with an agent that asks again at once: p50/p99,
//     on and off;
//  3. the same agent's turn through Quarry's relay, the trainer answering
//     with the Python SDK's q.model.calls(): p50/p99, for comparison.
//
// The timed loops run in Python (rockbench.py, with -python: a python with
// rl-rock); the gateways are real binaries from -bin. `make bench` runs it.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/quarryhq/quarry/bench/internal/dockergw"
	"github.com/quarryhq/quarry/bench/internal/procgw"
	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/internal/stats"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "rockbench:", err)
		os.Exit(1)
	}
}

type options struct {
	bin, python, image, out              string
	nohupOn, nohupOff, turnsOn, turnsOff int
	relayTurns                           int
}

// result is one measured series.
type result struct {
	Name   string             `json:"name"`
	Values map[string]float64 `json:"values"`
}

const key = "rockbench-key-0123456789"

func run(ctx context.Context) error {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory with the gateway and execagent binaries")
	flag.StringVar(&o.python, "python", ".cache/rock-venv/bin/python", "a python with ROCK's SDK (scripts/rock-sdk.sh)")
	flag.StringVar(&o.image, "image", "quarry-test/python:latest", "the Docker image with rl-rock (scripts/images/python.sh)")
	flag.StringVar(&o.out, "json", "", "write results as JSON to this file")
	flag.IntVar(&o.nohupOn, "nohup", 300, "nohup aruns with the hold on")
	flag.IntVar(&o.nohupOff, "nohup-off", 6, "nohup aruns with the hold off (each waits 5 s or more)")
	flag.IntVar(&o.turnsOn, "turns", 40, "anti_call_llm turns with the hold on")
	flag.IntVar(&o.turnsOff, "turns-off", 5, "anti_call_llm turns with the hold off")
	flag.IntVar(&o.relayTurns, "relay-turns", 200, "turns through Quarry's relay")
	flag.Parse()
	fmt.Printf("rockbench: ROCK's SDK on Quarry, hold of kill -0 on (8 s) and off, %d CPUs\n", runtime.NumCPU())

	var results []result
	add := func(name string, secs []float64) {
		ds := make([]time.Duration, len(secs))
		for i, s := range secs {
			ds[i] = time.Duration(s * float64(time.Second))
		}
		v := map[string]float64{"n": float64(len(ds)), "p50_ms": ms(stats.Percentile(ds, 50)), "p99_ms": ms(stats.Percentile(ds, 99))}
		results = append(results, result{Name: name, Values: v})
		fmt.Printf("  %-44s n=%-4d p50 %9.1f ms  p99 %9.1f ms\n", name, len(ds), v["p50_ms"], v["p99_ms"])
	}

	// 1. nohup aruns, process provider: `true`, which has ended by the
	// SDK's first check (made at once), and `sleep 0.2; echo done`, which
	// has not (the 5.05 s).
	fmt.Println("== nohup arun (process provider)")
	for _, c := range []struct {
		name, hold, cmd string
		n               int
	}{
		{"nohup arun of true, hold on", "", "true", o.nohupOn},
		{"nohup arun of true, hold off", "off", "true", o.nohupOff},
		{"nohup arun of sleep 0.2, hold on", "", "sleep 0.2; echo done", o.nohupOn / 3},
		{"nohup arun of sleep 0.2, hold off", "off", "sleep 0.2; echo done", o.nohupOff},
	} {
		env := []string{}
		if c.hold != "" {
			env = append(env, "QUARRY_ROCK_POLL_HOLD="+c.hold)
		}
		g, err := procgw.Start(ctx, procgw.Options{Bin: o.bin, Key: key, Env: env, Pools: "pools:\n  - name: default\n    image: host\n    min_warm: 1\n    max_total: 4\n"})
		if err != nil {
			return err
		}
		secs, err := o.py(ctx, "nohup", g.Base, key, fmt.Sprint(c.n), c.cmd)
		g.Stop()
		if err != nil {
			return err
		}
		add(c.name, secs)
	}

	// 2. and 3. ModelService turns in Docker, then the relay's.
	fmt.Printf("== one LLM turn, agent in a Docker sandbox of %s\n", o.image)
	pools := fmt.Sprintf("pools:\n  - name: py\n    image: %s\n    cpu: 1\n    memory: 512Mi\n    min_warm: 1\n    max_total: 2\n", o.image)
	for _, c := range []struct {
		name, hold string
		turns      int
		relay      bool
	}{
		{"anti_call_llm turn, hold on", "", o.turnsOn, false},
		{"anti_call_llm turn, hold off", "off", o.turnsOff, false},
		{"turn through Quarry's relay (q.model.calls)", "", o.relayTurns, true},
	} {
		_, gwID, done, err := dockergw.Engine("rockbench")
		if err != nil {
			return err
		}
		env := []string{"QUARRY_RETRY_AFTER=1s"}
		if c.hold != "" {
			env = append(env, "QUARRY_ROCK_POLL_HOLD="+c.hold)
		}
		dir, err := os.MkdirTemp("", "rockbench-")
		if err != nil {
			done()
			return err
		}
		bin, _ := filepath.Abs(o.bin)
		g, err := dockergw.Start(dockergw.Options{Bin: bin, Dir: filepath.Join(dir, "gw"), Key: key, GatewayID: gwID, Pools: pools, Env: env})
		if err != nil {
			done()
			return err
		}
		err = g.WaitPool(ctx, "py", 3*time.Minute, func(p client.Pool) bool { return p.Ready >= 1 })
		var secs []float64
		if err == nil {
			if c.relay {
				secs, err = o.py(ctx, "relay", g.Base, key, "py", fmt.Sprint(c.turns))
			} else {
				secs, err = o.py(ctx, "turns", g.Base, key, o.image, fmt.Sprint(c.turns))
			}
		}
		if err != nil {
			err = fmt.Errorf("%s: %w (gateway log: %s)", c.name, err, g.LogTail())
		}
		g.Stop()
		done()
		_ = os.RemoveAll(dir)
		if err != nil {
			return err
		}
		add(c.name, secs)
	}
	ratio := func(a, b string) {
		var x, y float64
		for _, r := range results {
			switch r.Name {
			case a:
				x = r.Values["p50_ms"]
			case b:
				y = r.Values["p50_ms"]
			}
		}
		if x > 0 {
			fmt.Printf("  p50 %s / %s: %.1fx\n", b, a, y/x)
		}
	}
	ratio("nohup arun of true, hold on", "nohup arun of true, hold off")
	ratio("nohup arun of sleep 0.2, hold on", "nohup arun of sleep 0.2, hold off")
	ratio("anti_call_llm turn, hold on", "anti_call_llm turn, hold off")
	ratio("turn through Quarry's relay (q.model.calls)", "anti_call_llm turn, hold on")
	if o.out != "" {
		b, _ := json.MarshalIndent(results, "", "  ")
		return os.WriteFile(o.out, b, 0o644)
	}
	return nil
}

// py runs rockbench.py MODE ARGS... and returns its "seconds".
func (o options) py(ctx context.Context, mode string, args ...string) ([]float64, error) {
	script := filepath.Join("bench", "rockbench", "rockbench.py")
	cmd := exec.CommandContext(ctx, o.python, append([]string{script, mode}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		tail := stderr.Bytes()
		if len(tail) > 4000 {
			tail = tail[len(tail)-4000:]
		}
		return nil, fmt.Errorf("rockbench.py %s: %w\n%s", mode, err, tail)
	}
	var res struct {
		Seconds []float64 `json:"seconds"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(lastLine(stdout.Bytes())), &res); err != nil {
		return nil, fmt.Errorf("rockbench.py %s: %w: %q", mode, err, stdout.String())
	}
	return res.Seconds, nil
}

func lastLine(b []byte) []byte {
	b = bytes.TrimRight(b, "\n")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		return b[i+1:]
	}
	return b
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
