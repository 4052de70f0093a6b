package scalebench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// binDir holds the binaries TestMain builds.
var binDir string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "scalebench-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "temp dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	for _, b := range []struct{ out, pkg string }{
		{"gateway", "./cmd/gateway"}, {"agentsim", "./bench/agentsim/cmd/agentsim"}, {"ddbsim", "./bench/ddbsim/cmd/ddbsim"},
	} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, b.out), b.pkg)
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", b.pkg, err, out)
			return 1
		}
	}
	binDir = dir
	return m.Run()
}

func TestFloor(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int
		want time.Duration
	}{
		{"within the burst", 100, 90 * time.Second},
		{"1k", 1000, 135 * time.Second},
		{"4k", 4000, 285 * time.Second},
		{"10k", 10000, 585 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) { assert.Equal(t, tc.want, Floor(tc.n)) })
	}
}

func TestConfig_ScalesDurationsAndRates(t *testing.T) {
	c := Config{TimeScale: 0.1}.WithDefaults()
	env := c.gatewayEnv()
	assert.Contains(t, env, "QUARRY_RECONCILE_INTERVAL=200ms")
	assert.Contains(t, env, "QUARRY_ECS_START_TIMEOUT=30s")
	assert.Contains(t, env, "QUARRY_ECS_LAUNCH_RATE=200")
	assert.Contains(t, env, "QUARRY_ECS_MAX_STARTING=1900", "a count is not scaled")
	assert.Contains(t, c.ddbsimArgs(), "1ms", "the index lag of 10 ms")
	assert.Equal(t, 30, c.wallSeconds(300))
	assert.Equal(t, 1, c.wallSeconds(1), "whole seconds, at least 1")
}

// TestRun_TinyFleet is the harness's smoke test: 20 sandboxes on two real
// gateway replicas against the simulators, at time scale 0.05 (a simulated
// minute is 3 s). It checks that every phase ran and was counted, never
// how fast (speed goals are benchmarks).
func TestRun_TinyFleet(t *testing.T) {
	var log bytes.Buffer
	out := filepath.Join(t.TempDir(), "results.json")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rs, err := Run(ctx, Config{
		Sizes: []int{20}, Replicas: 2, TimeScale: 0.05, Bin: binDir, Dir: t.TempDir(), Probes: 3,
		SteadyWindow: time.Minute, Heartbeat: 30 * time.Second, Clients: 16, Out: out, Log: &log,
	})
	t.Log(log.String())
	require.NoError(t, err)
	require.Len(t, rs, 1)
	r := rs[0]
	for _, note := range r.Notes { // the reconciler's pass time may not be exported
		assert.NotContains(t, note, "failed")
		assert.NotContains(t, note, "incomplete")
	}
	assert.True(t, r.Fill.Complete, "20 of 20 ready")
	assert.Positive(t, r.Fill.RatioToFloor)
	assert.Equal(t, 20, r.Acquire.OK, "every acquire succeeded: %v", r.Acquire.Errors)
	assert.Equal(t, 20, r.CreateAlive.OK, "every first exec succeeded: %v", r.CreateAlive.Errors)
	assert.Equal(t, 3, r.Probes.OK, "%v", r.Probes.Errors)
	assert.Equal(t, 20, r.Steady.Leased)
	assert.Positive(t, r.Steady.Heartbeats)
	assert.Zero(t, r.Steady.HeartbeatErrors)
	assert.Positive(t, r.Steady.StorePerMin["UpdateItem"]+r.Steady.StorePerMin["TransactWriteItems"], "heartbeats reach the store: %v", r.Steady.StorePerMin)
	assert.Positive(t, r.Steady.ByCallerPerMin["heartbeat"], "%v", r.Steady.ByCallerPerMin)
	assert.Positive(t, r.Steady.WriteUnits)
	assert.Positive(t, r.Steady.CostPer10kSbxHours)
	require.Len(t, r.Memory, 2)
	for _, m := range r.Memory {
		assert.Positive(t, m.RSSKiB)
	}
	assert.Contains(t, log.String(), "| concurrency | create→alive p50")
	assert.Contains(t, log.String(), "(simulated")
	var saved []Result
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &saved))
	assert.Len(t, saved, 1)
}
