// Package ddbsimtest starts the DynamoDB simulator (bench/ddbsim, a
// simulator of DynamoDB, not DynamoDB) for a test: on a loopback port,
// stopped when the test ends. It imports ddbsim and the standard library
// only.
package ddbsimtest

import (
	"context"
	"testing"
	"time"

	"github.com/quarryhq/quarry/bench/ddbsim"
)

// Start serves a new simulator with cfg on 127.0.0.1 until t ends (its
// cleanup closes it and fails t if that fails) and returns its endpoint
// URL (for ddbsim.Client) and the simulator (for its Stats).
func Start(t testing.TB, cfg ddbsim.Config) (string, *ddbsim.Server) {
	t.Helper()
	sim := ddbsim.New(cfg)
	url, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatalf("start the DynamoDB simulator: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := sim.Close(ctx); err != nil {
			t.Errorf("close the DynamoDB simulator: %v", err)
		}
	})
	return url, sim
}
