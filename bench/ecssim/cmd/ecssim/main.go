// Command ecssim serves bench/ecssim, a simulator of ECS on Fargate (not
// ECS) for benchmarks only, on a loopback address until SIGINT or SIGTERM.
// It prints its endpoint (for AWS_ENDPOINT_URL_ECS) on the first line of
// stdout; GET <endpoint>/ecssim/stats returns its counters (simulated
// figures). With -agentsim it starts that many agentsim processes and
// brings each task's simulated agent up while the task runs, with the
// token derived from -token-key (the gateways' QUARRY_ECS_TOKEN_KEY).
// With -pull-rate a task's start includes its image's pull (its size from
// -images, a JSON registry table, or a function of its name; simulated).
// bench/scalebench runs the same simulator in its own process.
//
//	ecssim -addr 127.0.0.1:0 -time-scale 0.1 -agentsim bin/agentsim -procs 4 -token-key $KEY
//	ecssim -pull-rate 104857600 -images registry.json -strict-registry
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/quarryhq/quarry/bench/agentsim"
	"github.com/quarryhq/quarry/bench/ecssim"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ecssim:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("ecssim", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "loopback address to listen on (port 0 picks one)")
	agentBin := fs.String("agentsim", "", "the agentsim command; empty: tasks run without agents")
	procs := fs.Int("procs", 1, "agentsim processes (each serves at most ~5,000 agents: 20,000 open files)")
	keyHex := fs.String("token-key", "", "the agents' token key in hex (QUARRY_ECS_TOKEN_KEY); required with -agentsim")
	var cfg ecssim.Config
	fs.Float64Var(&cfg.TimeScale, "time-scale", ecssim.DefaultTimeScale, "0 < s <= 1: every duration times s, every rate divided by s")
	fs.DurationVar(&cfg.StartMin, "start-min", ecssim.DefaultStartMin, "shortest start (simulated)")
	fs.DurationVar(&cfg.StartMax, "start-max", ecssim.DefaultStartMax, "longest start (simulated)")
	fs.StringVar(&cfg.LaunchRefusal, "launch-refusal", ecssim.RefuseWithException, "how a RunTask over the launch bucket is answered: exception or failures")
	fs.IntVar(&cfg.AddrBase, "addr-base", ecssim.DefaultAddrBase, "task IPs are in 127.B.0.0/16 from this B")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "seed of the start and stop times (0: random)")
	fs.Float64Var(&cfg.RegisterRate, "register-rate", ecssim.DefaultRegisterRate, "RegisterTaskDefinition (and DeregisterTaskDefinition) calls per simulated second")
	fs.IntVar(&cfg.RegisterBurst, "register-burst", ecssim.DefaultRegisterBurst, "burst of RegisterTaskDefinition (and DeregisterTaskDefinition) calls")
	fs.Float64Var(&cfg.PullRate, "pull-rate", 0, "image pull speed in bytes per simulated second (0: pulls add nothing to the start time)")
	imagesFile := fs.String("images", "", "the simulated registry: a JSON object of image reference to size in bytes (unlisted images are sized by their name)")
	fs.BoolVar(&cfg.StrictRegistry, "strict-registry", false, "an image not in -images does not exist (its tasks stop with CannotPullContainerError)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	if *imagesFile != "" {
		b, err := os.ReadFile(*imagesFile)
		if err != nil {
			return fmt.Errorf("-images: %w", err)
		}
		if err := json.Unmarshal(b, &cfg.Images); err != nil {
			return fmt.Errorf("-images %s: want a JSON object of image to size in bytes: %w", *imagesFile, err)
		}
	}
	if *agentBin != "" {
		key, err := agentapi.ParseTokenKey(*keyHex)
		if err != nil {
			return fmt.Errorf("-token-key: %w", err)
		}
		agents, err := agentsim.StartProcs(ctx, agentsim.ProcsConfig{Command: []string{*agentBin}, Procs: *procs})
		if err != nil {
			return err
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			_ = agents.Close(cctx)
		}()
		cfg.Agents, cfg.TokenKey = agents, key
	}
	sim, err := ecssim.New(cfg)
	if err != nil {
		return err
	}
	url, err := sim.Start(*addr)
	if err != nil {
		_ = sim.Close(ctx)
		return err
	}
	fmt.Println(url)
	cfg.Log.Info("serving a simulator of ECS on Fargate (simulated figures, for benchmarks only)", "endpoint", url, "time_scale", sim.Config().TimeScale)
	<-ctx.Done()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return sim.Close(cctx)
}
