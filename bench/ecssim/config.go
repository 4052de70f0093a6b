package ecssim

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/quarryhq/quarry/internal/defaults"
)

// Defaults of Config (simulated figures: AWS's published limits and the
// start times users report).
const (
	DefaultTimeScale        = 1.0
	DefaultStartMin         = 30 * time.Second
	DefaultStartMax         = 90 * time.Second
	DefaultStopMin          = 2 * time.Second
	DefaultStopMax          = 6 * time.Second
	DefaultStoppedRetention = time.Hour
	DefaultRunTaskRate      = 20.0
	DefaultRunTaskBurst     = 20
	DefaultLaunchRate       = 20.0
	DefaultLaunchBurst      = 100
	// DefaultRegisterRate and DefaultRegisterBurst are AWS's published
	// rate of RegisterTaskDefinition (1/s, burst 20); the simulator puts
	// DeregisterTaskDefinition in the same bucket.
	DefaultRegisterRate  = 1.0
	DefaultRegisterBurst = 20
	DefaultAddrBase      = 100
	DefaultAddrBlocks    = 4
	DefaultAgentPort     = 8000
	DefaultRegion        = "us-east-1"
	DefaultAccountID     = "123456789012"
	// MaxTasksPerCall, MaxDescribeIDs and MaxListPage are ECS's limits:
	// tasks one RunTask starts, ids one DescribeTasks takes, ARNs one
	// ListTasks page holds.
	MaxTasksPerCall = 10
	MaxDescribeIDs  = 100
	MaxListPage     = 100
	// MaxTags is ECS's limit of tags per resource.
	MaxTags = 50
	// MaxStopReason is ECS's limit on StopTask's reason.
	MaxStopReason = 255
)

// Launch refusals (Config.LaunchRefusal): how a RunTask whose tasks the
// launch bucket cannot cover is answered.
const (
	// RefuseWithException refuses the whole call with
	// InvalidParameterException "Rate exceeded" (what users report).
	RefuseWithException = "exception"
	// RefuseWithFailures starts the tasks the bucket covers and reports the
	// others in the answer's failures.
	RefuseWithFailures = "failures"
)

// addrsPerBlock is how many task addresses one 127.B.0.0/16 block holds:
// 127.B.x.y with x = i/250 (0..255) and y = i%250 + 1.
const addrsPerBlock = 256 * 250

// Config sets what the simulator simulates. Durations and rates are in
// simulated time; TimeScale maps them to the wall clock. Zero fields take
// the defaults.
type Config struct {
	// TimeScale (0 < s ≤ 1, default 1) multiplies every duration and
	// divides every rate: the simulated world runs 1/s times faster.
	TimeScale float64
	// StartMin and StartMax bound a task's start time (RunTask to
	// RUNNING), drawn uniformly: 30 and 90 s.
	StartMin, StartMax time.Duration
	// StopMin and StopMax bound a stop (StopTask to STOPPED): 2 and 6 s.
	StopMin, StopMax time.Duration
	// StoppedRetention is how long a stopped task stays describable: 1 h.
	StoppedRetention time.Duration
	// RunTaskRate and RunTaskBurst are the RunTask call bucket (20/s,
	// burst 20); LaunchRate and LaunchBurst each capacity provider's task
	// launch bucket (20/s, burst 100).
	RunTaskRate  float64
	RunTaskBurst int
	LaunchRate   float64
	LaunchBurst  int
	// LaunchRefusal is RefuseWithException (the default) or
	// RefuseWithFailures.
	LaunchRefusal string
	// RegisterRate and RegisterBurst are the bucket of
	// RegisterTaskDefinition and DeregisterTaskDefinition calls (1/s, burst
	// 20; over it ThrottlingException "Rate exceeded").
	RegisterRate  float64
	RegisterBurst int
	// PullRate is how fast a task pulls its image, in bytes per simulated
	// second: a task runs after its start time plus its image's size /
	// PullRate (simulated). 0 (the default): pulls add nothing to the
	// start time (30–90 s, which holds a small image's pull).
	PullRate float64
	// Images is the simulated registry: image reference (as the task
	// definition's sandbox container names it) → size in bytes. An image
	// it does not hold is sized by DefaultImageSize, or, with
	// StrictRegistry, does not exist: its tasks stop while starting with
	// CannotPullContainerError "… not found", as on Fargate.
	Images         map[string]int64
	StrictRegistry bool
	// AddrBase is the second octet of the first block of task addresses
	// (127.AddrBase.0.0/16, default 100) and AddrBlocks how many
	// consecutive blocks there are (default 4: 256,000 addresses).
	AddrBase   int
	AddrBlocks int
	// AgentPort is the port of every task's agent (default 8000, the ECS
	// provider's QUARRY_ECS_AGENT_PORT).
	AgentPort int
	// TokenKey is the agents' token key (the gateways'
	// QUARRY_ECS_TOKEN_KEY); each agent's token is derived from it and its
	// task ARN. Required when Agents is set.
	TokenKey []byte
	// Agents brings task agents up and down (nil: tasks run without
	// agents).
	Agents Agents
	// OnChange, when set, is called after every change of a task's
	// lastStatus or desiredStatus, outside the simulator's lock (so two
	// changes of one task close together may arrive out of order, as
	// EventBridge's events may). It must not block for long.
	OnChange func(Change)
	// Region and AccountID appear in ARNs.
	Region    string
	AccountID string
	// Seed seeds the start and stop times (0: a random seed).
	Seed uint64
	// Log receives a line per refusal (at most one a second per limit) and
	// per agent that does not come up (nil: discarded).
	Log *slog.Logger
}

// Agents brings the agents of tasks up and down: agentsim.Farm and
// agentsim.Procs implement it. Calls may come from several goroutines.
type Agents interface {
	// Up serves an agent on addr (host:port) that answers token.
	Up(addr, token string) error
	// Down stops the agent on addr.
	Down(addr string) error
}

// WithDefaults returns c with its zero fields set to the defaults.
func (c Config) WithDefaults() Config {
	defaults.Set(&c.TimeScale, DefaultTimeScale)
	defaults.Set(&c.StartMin, DefaultStartMin)
	defaults.Set(&c.StartMax, DefaultStartMax)
	defaults.Set(&c.StopMin, DefaultStopMin)
	defaults.Set(&c.StopMax, DefaultStopMax)
	defaults.Set(&c.StoppedRetention, DefaultStoppedRetention)
	defaults.Set(&c.RunTaskRate, DefaultRunTaskRate)
	defaults.Set(&c.RunTaskBurst, DefaultRunTaskBurst)
	defaults.Set(&c.LaunchRate, DefaultLaunchRate)
	defaults.Set(&c.LaunchBurst, DefaultLaunchBurst)
	defaults.Set(&c.LaunchRefusal, RefuseWithException)
	defaults.Set(&c.RegisterRate, DefaultRegisterRate)
	defaults.Set(&c.RegisterBurst, DefaultRegisterBurst)
	defaults.Set(&c.AddrBase, DefaultAddrBase)
	defaults.Set(&c.AddrBlocks, DefaultAddrBlocks)
	defaults.Set(&c.AgentPort, DefaultAgentPort)
	defaults.Set(&c.Region, DefaultRegion)
	defaults.Set(&c.AccountID, DefaultAccountID)
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports every invalid field of c (after defaults).
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.TimeScale <= 0 || c.TimeScale > 1 {
		bad("TimeScale: want 0 < s <= 1, got %g", c.TimeScale)
	}
	if c.StartMin <= 0 || c.StartMax < c.StartMin {
		bad("StartMin, StartMax: want 0 < min <= max, got %s and %s", c.StartMin, c.StartMax)
	}
	if c.StopMin <= 0 || c.StopMax < c.StopMin {
		bad("StopMin, StopMax: want 0 < min <= max, got %s and %s", c.StopMin, c.StopMax)
	}
	if c.StoppedRetention <= 0 {
		bad("StoppedRetention: must be positive, got %s", c.StoppedRetention)
	}
	if c.RunTaskRate <= 0 || c.RunTaskBurst < 1 {
		bad("RunTaskRate, RunTaskBurst: must be positive, got %g/s burst %d", c.RunTaskRate, c.RunTaskBurst)
	}
	if c.LaunchRate <= 0 || c.LaunchBurst < MaxTasksPerCall {
		bad("LaunchRate, LaunchBurst: rate must be positive and burst at least %d, got %g/s burst %d", MaxTasksPerCall, c.LaunchRate, c.LaunchBurst)
	}
	if c.RegisterRate <= 0 || c.RegisterBurst < 1 {
		bad("RegisterRate, RegisterBurst: must be positive, got %g/s burst %d", c.RegisterRate, c.RegisterBurst)
	}
	if c.PullRate < 0 {
		bad("PullRate: must be 0 (no pull time) or positive, got %g", c.PullRate)
	}
	for image, size := range c.Images {
		if size < 0 {
			bad("Images[%q]: a size is at least 0, got %d", image, size)
		}
	}
	if c.LaunchRefusal != RefuseWithException && c.LaunchRefusal != RefuseWithFailures {
		bad("LaunchRefusal: want %q or %q, got %q", RefuseWithException, RefuseWithFailures, c.LaunchRefusal)
	}
	if c.AddrBase < 1 || c.AddrBlocks < 1 || c.AddrBase+c.AddrBlocks > 256 {
		bad("AddrBase, AddrBlocks: want blocks 127.B.0.0/16 with 1 <= B and B + blocks <= 256, got %d and %d", c.AddrBase, c.AddrBlocks)
	}
	if c.AgentPort < 1 || c.AgentPort > 65535 {
		bad("AgentPort: must be a port number, got %d", c.AgentPort)
	}
	if c.Agents != nil && len(c.TokenKey) == 0 {
		bad("TokenKey: required with Agents (each agent's token is derived from it)")
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ecs simulator config: %w", err)
	}
	return nil
}

// wall returns the wall-clock length of simulated duration d.
func (c Config) wall(d time.Duration) time.Duration {
	return time.Duration(float64(d) * c.TimeScale)
}

// wallRate returns the wall-clock rate of simulated rate r (per second).
func (c Config) wallRate(r float64) float64 { return r / c.TimeScale }
