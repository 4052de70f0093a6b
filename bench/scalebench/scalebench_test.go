package scalebench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

func TestImageSet_AsksForEveryImageEvenly(t *testing.T) {
	for _, tc := range []struct {
		name     string
		n, m     int
		min, max int
	}{
		{"N a multiple of M", 500, 100, 5, 5},
		{"a remainder", 10, 3, 3, 4},
		{"one each", 7, 7, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newImageSet(tc.n, tc.m)
			require.Len(t, s.of, tc.n)
			require.Len(t, s.names, tc.m)
			counts := map[int]int{}
			for _, j := range s.of {
				counts[j]++
			}
			require.Len(t, counts, tc.m, "every image is asked for")
			for j, c := range counts {
				assert.GreaterOrEqual(t, c, tc.min, "image %d", j)
				assert.LessOrEqual(t, c, tc.max, "image %d", j)
			}
			for _, name := range s.names {
				assert.True(t, strings.HasPrefix(name, imageRegistry+"/") && strings.HasSuffix(name, ":latest"), "a normalized reference: %s", name)
				assert.GreaterOrEqual(t, s.sizes[name], int64(ImageBaseSize+ImageLayerMin))
				assert.LessOrEqual(t, s.sizes[name], int64(ImageBaseSize+ImageLayerMax))
			}
			assert.Equal(t, s, newImageSet(tc.n, tc.m), "every run asks for the same batch in the same order")
		})
	}
}

func TestImageFloor(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		name                    string
		n, m                    int
		largest                 int64
		pullRate                float64
		register, launch, start float64
	}{
		{"issue 22's batch", 10000, 2000, gib, gib / 10, 1980, 495, 100},
		{"the smoke size", 500, 100, gib, gib / 10, 80, 20, 100},
		{"within both bursts", 100, 20, gib, gib / 10, 0, 0, 100},
		{"no pull time", 1000, 50, gib, 0, 30, 45, 90},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := imageFloor(tc.n, tc.m, tc.largest, tc.pullRate)
			assert.Equal(t, tc.register, f.Register)
			assert.Equal(t, tc.launch, f.Launch)
			assert.Equal(t, tc.start, f.Start)
			assert.Equal(t, max(tc.register, tc.launch)+tc.start, f.Batch)
			assert.Equal(t, tc.launch+tc.start, f.Creates)
			assert.Equal(t, tc.register+tc.launch+tc.start, f.Prefetched)
		})
	}
}

func TestConfig_ImagesScenario(t *testing.T) {
	c := Config{TimeScale: 0.2, Images: 100, Sizes: []int{500}, Bin: binDir}.WithDefaults()
	require.NoError(t, c.Validate())
	pools := c.imagePools(500)
	assert.Contains(t, pools, "max_total: 500")
	assert.Contains(t, pools, `images: ["*"]`)
	assert.Contains(t, pools, "idle_seconds: 120", "600 simulated seconds at 0.2")
	assert.Contains(t, pools, "warm_max: 0")
	assert.Contains(t, c.imagesEnv(), "QUARRY_CREATE_TIMEOUT=1m0s")
	assert.Contains(t, c.imagesEnv(), "QUARRY_IMAGE_PREPARE_TIMEOUT=3m0s")
	assert.Contains(t, c.gatewayEnv(), "QUARRY_ECS_REGISTER_RATE=5", "1/s at 0.2")
	assert.Equal(t, float64(DefaultImagePullRate), c.ImagePullRate)
	for _, bad := range []Config{
		{TimeScale: 0.2, Images: 100, Sizes: []int{50}, Bin: binDir},    // fewer sandboxes than images
		{TimeScale: 0.2, Images: 100, Sizes: []int{20000}, Bin: binDir}, // beyond a class's max_total
	} {
		assert.Error(t, bad.WithDefaults().Validate(), "%+v", bad.Sizes)
	}
	_, err := Run(context.Background(), c)
	assert.ErrorContains(t, err, "RunImages", "the fleet scenario's Run refuses an images config")
}

func TestRetryable(t *testing.T) {
	assert.True(t, retryable(&httpError{status: 503}))
	assert.True(t, retryable(&httpError{status: 429}))
	assert.True(t, retryable(errors.New("connection reset")), "no answer")
	assert.False(t, retryable(&httpError{status: 404}))
	assert.False(t, retryable(&httpError{status: 403}))
}

// TestRunImages_TinyBatch is the images scenario's smoke test: 12
// sandboxes over 4 images on two real gateway replicas, both modes, at
// time scale 0.05. It checks that every phase ran and was counted, never
// how fast.
func TestRunImages_TinyBatch(t *testing.T) {
	var log bytes.Buffer
	out := filepath.Join(t.TempDir(), "images.json")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rs, err := RunImages(ctx, Config{
		Sizes: []int{12}, Images: 4, Replicas: 2, TimeScale: 0.05, Bin: binDir, Dir: t.TempDir(),
		ImageIdleSeconds: 30, Out: out, Log: &log,
	})
	t.Log(log.String())
	require.NoError(t, err)
	require.Len(t, rs, 1)
	r := rs[0]
	require.Len(t, r.Modes, 2)
	for _, m := range r.Modes {
		assert.Empty(t, m.Notes, m.Mode)
		assert.Zero(t, m.Lost, "%s: %v", m.Mode, m.LostBy)
		assert.True(t, m.Complete, m.Mode)
		assert.Equal(t, 12, m.FirstCommand.OK, m.Mode)
		assert.GreaterOrEqual(t, m.Registrations, 4, "%s: every image registered", m.Mode)
		assert.Positive(t, m.TasksLaunched, m.Mode)
		assert.Positive(t, m.BatchSimSeconds, m.Mode)
		assert.Positive(t, m.BatchStoreCalls, m.Mode)
		assert.Equal(t, 4, m.End.PoolsEnded+m.End.PoolsActive, "%s: every image has its pool", m.Mode)
		require.Len(t, m.Memory, 2)
	}
	assert.Nil(t, r.Modes[0].Prefetch)
	require.NotNil(t, r.Modes[1].Prefetch)
	assert.Equal(t, 4, r.Modes[1].Prefetch.Ready)
	assert.Equal(t, 1.0, r.Modes[1].RegistrationsPerImg, "a prefetch from one replica registers each image once")
	assert.Contains(t, log.String(), "| simulated unless marked | no prefetch | prefetch |")
	var saved []ImagesResult
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &saved))
	assert.Len(t, saved, 1)
}
