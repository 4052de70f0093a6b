// Command ddbsim serves bench/ddbsim, a simulator of DynamoDB (not
// DynamoDB) for benchmarks only, on a loopback address until SIGINT or
// SIGTERM. It prints its endpoint (for AWS_ENDPOINT_URL) on the first line
// of stdout; GET <endpoint>/ddbsim/stats returns its counters (simulated
// figures).
//
//	go run ./bench/ddbsim/cmd/ddbsim -addr 127.0.0.1:8000 -index-lag 10ms
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/quarryhq/quarry/bench/ddbsim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ddbsim:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("ddbsim", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8000", "loopback address to listen on (port 0 picks one)")
	var cfg ddbsim.Config
	fs.DurationVar(&cfg.IndexLag, "index-lag", ddbsim.DefaultIndexLag, "how long writes take to reach global indexes (negative: at once)")
	fs.Float64Var(&cfg.PartitionReadUnits, "partition-read-units", ddbsim.DefaultPartitionReadUnits, "read units/s per partition key (negative: no limit)")
	fs.Float64Var(&cfg.PartitionWriteUnits, "partition-write-units", ddbsim.DefaultPartitionWriteUnits, "write units/s per partition key (negative: no limit)")
	fs.Float64Var(&cfg.TableReadUnits, "table-read-units", ddbsim.DefaultTableUnits, "read units/s per table (negative: no limit)")
	fs.Float64Var(&cfg.TableWriteUnits, "table-write-units", ddbsim.DefaultTableUnits, "write units/s per table (negative: no limit)")
	fs.DurationVar(&cfg.TableCreateDelay, "table-create-delay", 0, "how long a new table stays CREATING")
	fs.StringVar(&cfg.Region, "region", ddbsim.DefaultRegion, "region in ARNs")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	sim := ddbsim.New(cfg)
	url, err := sim.Start(*addr)
	if err != nil {
		return err
	}
	fmt.Println(url)
	cfg.Log.Info("serving a simulator of DynamoDB (simulated figures, for benchmarks only)", "endpoint", url)
	<-ctx.Done()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return sim.Close(cctx)
}
