package scalebench

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/quarryhq/quarry/bench/ddbsim"
	"github.com/quarryhq/quarry/bench/ecssim"
	"github.com/quarryhq/quarry/internal/defaults"
)

// Defaults of Config.
const (
	DefaultTimeScale     = 0.2
	DefaultReplicas      = 2
	DefaultClients       = 512
	DefaultProbes        = 50
	DefaultAgentsPerProc = 1500
	// DefaultSteadyWindow is the simulated length of the steady-state
	// window; DefaultHeartbeat the trainers' heartbeat cadence (simulated).
	DefaultSteadyWindow = 5 * time.Minute
	DefaultHeartbeat    = time.Minute
	// DefaultLeaseSeconds is the trainers' lease (simulated seconds).
	DefaultLeaseSeconds = 1800
	// DefaultStartupSeconds is the pool's startup_timeout_seconds
	// (simulated): ECS's own start timeout, above Fargate's 30–90 s.
	DefaultStartupSeconds = 300
)

// Prices of DynamoDB on-demand request units in us-east-1 after AWS's
// price cut of 1 November 2024 ($ per unit), as summarised in
// /work/shared/reference/aws-limits.md (AWS's pricing page is the
// authority).
const (
	PriceWriteUnit = 0.625 / 1e6
	PriceReadUnit  = 0.125 / 1e6
	PriceDate      = "2024-11-01"
)

// Config is one run of the harness.
type Config struct {
	// Sizes are the fleet sizes N, run one after another, each in a fresh
	// world.
	Sizes []int
	// Replicas is how many gateway processes run (default 2).
	Replicas int
	// TimeScale (0 < s ≤ 1): the simulated world runs 1/s times faster
	// than the wall clock (default 0.2).
	TimeScale float64
	// Bin holds the binaries gateway, agentsim and ddbsim.
	Bin string
	// Dir is where the run keeps its logs and data (default a new temp
	// directory, removed unless Keep).
	Dir  string
	Keep bool
	// Clients bounds the connections the trainers open to each gateway
	// (default 512) for acquires, heartbeats and probes, and as many more
	// for their first execs.
	Clients int
	// Probes is the size of a second pool beside the fleet's (a pool holds
	// at most 10,000), whose tasks are acquired one at a time with N
	// leased (default 50).
	Probes int
	// AgentsPerProc is how many simulated agents one agentsim process
	// serves at most (default 1,500: a listener and a few connections
	// each, under the 20,000 open files of a process).
	AgentsPerProc int
	// SteadyWindow and Heartbeat are simulated durations (5 min and 60 s).
	SteadyWindow time.Duration
	Heartbeat    time.Duration
	// LeaseSeconds and StartupSeconds are simulated seconds (1,800, 300).
	LeaseSeconds   int
	StartupSeconds int
	// FillLimit caps the wait for N ready, as a multiple of the AWS floor
	// (default 3).
	FillLimit float64
	// GatewayEnv adds NAME=value settings to every replica, after the
	// harness's own (so they win); each result records them.
	GatewayEnv []string
	// Images, when positive, runs the images scenario (issue 22) instead
	// of the fleet's: each size N is a batch of N sandboxes over Images
	// distinct task images, run without and then with a prefetch, each in
	// a fresh world (images.go).
	Images int
	// ImagePullRate is the simulated Fargate pull rate in bytes per
	// simulated second (default DefaultImagePullRate, assumed).
	ImagePullRate float64
	// PrefetchWarm is the prefetch's warm (ready sandboxes kept for each
	// image; default 0: the prefetch registers, the creates cold-start).
	PrefetchWarm int
	// ImageWarmMax is the class's warm_max (default 0: a batch asks each
	// image a few times at once and never again, so the warm policy's
	// tasks would come after it, unused, and take its slots).
	ImageWarmMax int
	// ImageIdleSeconds is the class's idle_seconds (simulated; default
	// 600, the class's default).
	ImageIdleSeconds int
	// Out, when set, receives the results as JSON.
	Out string
	// Log receives progress lines and the report (default os.Stdout).
	Log io.Writer
}

// WithDefaults returns c with its zero fields set to the defaults.
func (c Config) WithDefaults() Config {
	defaults.Set(&c.Replicas, DefaultReplicas)
	defaults.Set(&c.TimeScale, DefaultTimeScale)
	defaults.Set(&c.Clients, DefaultClients)
	defaults.Set(&c.Probes, DefaultProbes)
	defaults.Set(&c.AgentsPerProc, DefaultAgentsPerProc)
	defaults.Set(&c.SteadyWindow, DefaultSteadyWindow)
	defaults.Set(&c.Heartbeat, DefaultHeartbeat)
	defaults.Set(&c.LeaseSeconds, DefaultLeaseSeconds)
	defaults.Set(&c.StartupSeconds, DefaultStartupSeconds)
	defaults.Set(&c.FillLimit, 3.0)
	defaults.Set(&c.Bin, "bin")
	defaults.Set(&c.ImagePullRate, DefaultImagePullRate)
	defaults.Set(&c.ImageIdleSeconds, 600)
	if c.Log == nil {
		c.Log = os.Stdout
	}
	return c
}

// Validate reports every invalid field of c (after defaults).
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(c.Sizes) == 0 {
		bad("Sizes: at least one size is required")
	}
	for _, n := range c.Sizes {
		if n < 1 {
			bad("Sizes: %d is not a positive size", n)
		}
	}
	if c.Replicas < 1 {
		bad("Replicas: want at least 1, got %d", c.Replicas)
	}
	if c.TimeScale <= 0 || c.TimeScale > 1 {
		bad("TimeScale: want 0 < s <= 1, got %g", c.TimeScale)
	}
	if c.Clients < 1 || c.Probes < 1 || c.AgentsPerProc < 1 {
		bad("Clients, Probes, AgentsPerProc: must be positive, got %d, %d, %d", c.Clients, c.Probes, c.AgentsPerProc)
	}
	if c.SteadyWindow < c.Heartbeat || c.Heartbeat <= 0 {
		bad("SteadyWindow, Heartbeat: want 0 < heartbeat <= window, got %s and %s", c.Heartbeat, c.SteadyWindow)
	}
	if c.Images < 0 || c.ImagePullRate < 0 || c.PrefetchWarm < 0 || c.ImageWarmMax < 0 || c.ImageIdleSeconds < 1 {
		bad("Images, ImagePullRate, PrefetchWarm, ImageWarmMax, ImageIdleSeconds: want >= 0 (idle >= 1), got %d, %g, %d, %d, %d",
			c.Images, c.ImagePullRate, c.PrefetchWarm, c.ImageWarmMax, c.ImageIdleSeconds)
	}
	for _, n := range c.Sizes {
		if c.Images > 0 && (n < c.Images || n > maxClassTotal) {
			bad("Sizes: the images scenario runs %d to %d sandboxes (at least one per image, at most a class's max_total), got %d", c.Images, maxClassTotal, n)
		}
	}
	if c.FillLimit < 1 {
		bad("FillLimit: want at least 1 (a multiple of the floor), got %g", c.FillLimit)
	}
	for _, b := range []string{"gateway", "agentsim", "ddbsim"} {
		if _, err := os.Stat(filepath.Join(c.Bin, b)); err != nil {
			bad("Bin: %s: %s (make bench-scale builds it)", b, err)
		}
	}
	return errors.Join(errs...)
}

// Floor is the AWS floor of a fill of n tasks from zero, in simulated
// time: the launch bucket (burst 100, then 20 tasks/s) lets the last task
// start at max(0, n − 100)/20 s, and it runs at most 90 s later.
func Floor(n int) time.Duration {
	launches := math.Max(0, float64(n-ecssim.DefaultLaunchBurst)) / ecssim.DefaultLaunchRate
	return time.Duration(launches*float64(time.Second)) + ecssim.DefaultStartMax
}

// wall returns the wall-clock length of simulated duration d.
func (c Config) wall(d time.Duration) time.Duration {
	return time.Duration(float64(d) * c.TimeScale)
}

// sim returns the simulated length of wall-clock duration d.
func (c Config) sim(d time.Duration) time.Duration {
	return time.Duration(float64(d) / c.TimeScale)
}

// wallSeconds returns simulated seconds as whole wall seconds (at least 1).
func (c Config) wallSeconds(sec int) int {
	return max(1, int(math.Round(float64(sec)*c.TimeScale)))
}

// gatewayEnv is the scaled part of a replica's configuration: every
// cadence and deadline that waits on the simulated world times s, every
// rate divided by s (docs/ARCHITECTURE.md, "One time scale"). Counts
// (bursts, the start slots) are not scaled.
func (c Config) gatewayEnv() []string {
	d := func(name string, v time.Duration) string { return name + "=" + c.wall(v).String() }
	r := func(name string, v float64) string {
		return name + "=" + strconv.FormatFloat(v/c.TimeScale, 'f', -1, 64)
	}
	return []string{
		d("QUARRY_RECONCILE_INTERVAL", 2*time.Second),
		d("QUARRY_REAP_INTERVAL", 5*time.Second),
		d("QUARRY_ORPHAN_INTERVAL", 30*time.Second),
		d("QUARRY_ORPHAN_GRACE", 2*time.Minute),
		d("QUARRY_HEALTH_CHECK_INTERVAL", 30*time.Second),
		d("QUARRY_LOCK_TTL", 15*time.Second),
		d("QUARRY_LAUNCH_BACKOFF", time.Second),
		d("QUARRY_LAUNCH_BACKOFF_MAX", time.Minute),
		d("QUARRY_ACQUIRE_TIMEOUT", 2*time.Minute),
		// The warm pool's launch queue and its incremental walk (issue 13;
		// a gateway without them ignores the variables).
		d("QUARRY_LAUNCH_QUEUE_TIMEOUT", 5*time.Minute),
		d("QUARRY_SWEEP_INTERVAL", 30*time.Second),
		r("QUARRY_DESCRIBE_RATE", 10),
		d("QUARRY_ECS_START_TIMEOUT", 5*time.Minute),
		d("QUARRY_ECS_POLL_INTERVAL", 2*time.Second),
		r("QUARRY_ECS_RUN_TASK_RATE", 20),
		r("QUARRY_ECS_LAUNCH_RATE", 20),
		r("QUARRY_ECS_TAG_RATE", 20),
		r("QUARRY_ECS_DESCRIBE_RATE", 20),
		r("QUARRY_ECS_REGISTER_RATE", ecssim.DefaultRegisterRate),
		// The start slots the provider derives from the launch rate
		// (burst + rate × 90 s): a count, so the unscaled 1,900.
		"QUARRY_ECS_MAX_STARTING=" + strconv.Itoa(ecssim.DefaultLaunchBurst+int(ecssim.DefaultLaunchRate*ecssim.DefaultStartMax.Seconds())),
	}
}

// ddbsimArgs are the DynamoDB simulator's flags at the time scale: its
// index lag times s, its unit rates divided by s.
func (c Config) ddbsimArgs() []string {
	r := func(v float64) string { return strconv.FormatFloat(v/c.TimeScale, 'f', -1, 64) }
	return []string{
		"-addr", "127.0.0.1:0",
		"-index-lag", c.wall(ddbsim.DefaultIndexLag).String(),
		"-partition-read-units", r(ddbsim.DefaultPartitionReadUnits),
		"-partition-write-units", r(ddbsim.DefaultPartitionWriteUnits),
		"-table-read-units", r(ddbsim.DefaultTableUnits), "-table-write-units", r(ddbsim.DefaultTableUnits),
	}
}
