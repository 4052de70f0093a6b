// Command scalebench runs the fleet simulation (bench/scalebench; `make
// bench-scale`): real gateway replicas on simulated ECS, Fargate, agents
// and DynamoDB, at each size given. Every figure it prints that depends
// on a simulator is labelled simulated.
//
//	scalebench -sizes 1000,4000,10000 -replicas 2 -time-scale 0.2 -bin bin -json .cache/bench/scale.json
//	scalebench -images 2000 -sizes 10000 -json .cache/bench/scale-images.json   # the images scenario (issue 22)
//	scalebench -images 100 -sizes 500                                     # its smoke size
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/quarryhq/quarry/bench/scalebench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "scalebench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("scalebench", flag.ContinueOnError)
	var cfg scalebench.Config
	sizes := fs.String("sizes", "1000,4000,10000", "fleet sizes N, comma-separated, each run in a fresh world (with -images: sandboxes of the batch, default 10000)")
	fs.IntVar(&cfg.Replicas, "replicas", scalebench.DefaultReplicas, "gateway replicas")
	fs.Float64Var(&cfg.TimeScale, "time-scale", scalebench.DefaultTimeScale, "0 < s <= 1: the simulated world runs 1/s times faster than the wall clock")
	fs.StringVar(&cfg.Bin, "bin", "bin", "directory with the gateway, agentsim and ddbsim binaries")
	fs.StringVar(&cfg.Dir, "dir", "", "directory for logs and data (default: a temp directory)")
	fs.BoolVar(&cfg.Keep, "keep", false, "keep the temp directory")
	fs.IntVar(&cfg.Clients, "clients", scalebench.DefaultClients, "connections the trainers open to each gateway at most")
	fs.IntVar(&cfg.Probes, "probes", scalebench.DefaultProbes, "acquires one at a time with N leased, from a second pool of this size")
	fs.DurationVar(&cfg.SteadyWindow, "window", scalebench.DefaultSteadyWindow, "steady-state window (simulated)")
	fs.DurationVar(&cfg.Heartbeat, "heartbeat", scalebench.DefaultHeartbeat, "the trainers' heartbeat cadence (simulated)")
	fs.Float64Var(&cfg.FillLimit, "fill-limit", 3, "give up the fill after this multiple of the AWS floor")
	fs.StringVar(&cfg.Out, "json", "", "write the results as JSON to this file")
	fs.IntVar(&cfg.Images, "images", 0, "run the images scenario: N sandboxes over this many distinct images, without and with a prefetch (0: the fleet scenario)")
	fs.Float64Var(&cfg.ImagePullRate, "pull-rate", scalebench.DefaultImagePullRate, "images scenario: Fargate's pull rate in bytes per simulated second (assumed)")
	fs.IntVar(&cfg.PrefetchWarm, "prefetch-warm", 0, "images scenario: the prefetch's warm (ready sandboxes kept per image)")
	fs.IntVar(&cfg.ImageWarmMax, "images-warm-max", 0, "images scenario: the class's warm_max")
	fs.IntVar(&cfg.ImageIdleSeconds, "images-idle", 600, "images scenario: the class's idle_seconds (simulated)")
	fs.Func("gateway-env", "NAME=value for every replica, over the harness's settings (repeatable; recorded in the results)", func(v string) error {
		if !strings.Contains(v, "=") {
			return fmt.Errorf("want NAME=value, got %q", v)
		}
		cfg.GatewayEnv = append(cfg.GatewayEnv, v)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	sizesSet := false
	fs.Visit(func(f *flag.Flag) { sizesSet = sizesSet || f.Name == "sizes" })
	if cfg.Images > 0 && !sizesSet {
		*sizes = strconv.Itoa(scalebench.DefaultImageSandboxes)
	}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("-sizes: %q is not a number", s)
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	if cfg.Images > 0 {
		_, err := scalebench.RunImages(ctx, cfg)
		return err
	}
	_, err := scalebench.Run(ctx, cfg)
	return err
}
