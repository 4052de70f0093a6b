//go:build benchfarm

package main

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"sync"

	"github.com/quarryhq/quarry/bench/gwmembench/farm"
	"github.com/quarryhq/quarry/providers"
)

// Variables of a gateway built for benchmarks.
const (
	// farmEndpointsEnv names the endpoints file of the farm provider.
	farmEndpointsEnv = "QUARRY_BENCH_FARM_ENDPOINTS"
	// pprofAddrEnv, when set, is a 127.0.0.1 address serving /debug/pprof/.
	pprofAddrEnv = "QUARRY_BENCH_PPROF_ADDR"
)

var pprofOnce sync.Once

// addBenchProviders adds the farm provider (bench/gwmembench/farm): tasks
// that are endpoints of an agent farm, listed in $QUARRY_BENCH_FARM_ENDPOINTS.
// Only benchmarks build the gateway with this file (go build -tags
// benchfarm); such a gateway also serves pprof on $QUARRY_BENCH_PPROF_ADDR.
func addBenchProviders(m map[string]providerMaker) {
	pprofOnce.Do(servePprof)
	m["farm"] = func(Config, *slog.Logger) (providers.Provider, error) {
		path := os.Getenv(farmEndpointsEnv)
		if path == "" {
			return nil, errors.New(farmEndpointsEnv + ": required by the farm provider")
		}
		eps, err := farm.ReadEndpoints(path)
		if err != nil {
			return nil, err
		}
		return farm.New(eps)
	}
}

func servePprof() {
	addr := os.Getenv(pprofAddrEnv)
	if addr == "" {
		return
	}
	if host, _, err := net.SplitHostPort(addr); err != nil || host != "127.0.0.1" {
		slog.Error(pprofAddrEnv + ": want 127.0.0.1:port")
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	go func() { _ = http.ListenAndServe(addr, mux) }()
}
