// Command agentsim serves simulated exec agents (bench/agentsim; not the
// agent) for benchmarks only, driven by lines on its stdin: "up ADDR TOKEN"
// starts an agent on the loopback address ADDR, "down ADDR" stops it,
// "stats" prints the counters; each command is answered with one line on
// stdout ("ok", "err MESSAGE", "stats JSON"), after a first line "ready".
// It takes its agents down and exits when stdin closes, or on SIGINT or
// SIGTERM. ecssim starts it (bench/ecssim/cmd/ecssim -agentsim).
//
//	printf 'up 127.100.0.1:8000 secret\n' | agentsim
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/quarryhq/quarry/bench/agentsim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "agentsim:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	farm := agentsim.NewFarm(agentsim.Config{Log: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = farm.Close(cctx)
	}()
	if _, err := fmt.Println("ready"); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- agentsim.Serve(ctx, os.Stdin, os.Stdout, farm) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return nil
	}
}
