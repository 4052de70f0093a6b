package warmpool

import (
	"errors"
	"fmt"
	"time"

	"github.com/quarryhq/quarry/internal/defaults"
)

// Config tunes the Manager. Zero fields take the defaults noted on each
// field (WithDefaults); cmd/ fills it from QUARRY_* variables with
// envconfig, which is what the tags are for.
type Config struct {
	// GatewayID is the deployment id of the gateway fleet, attached to every
	// task as providers.LabelGateway. The orphan sweep never stops tasks
	// labelled with another gateway id. Default "quarry".
	GatewayID string `envconfig:"QUARRY_GATEWAY_ID"`
	// ReconcileInterval is how often each pool is reconciled (default 2 s);
	// an acquire also wakes its pool's reconciler at once.
	ReconcileInterval time.Duration `envconfig:"QUARRY_RECONCILE_INTERVAL"`
	// ReapInterval is how often expired leases are ended (default 5 s).
	ReapInterval time.Duration `envconfig:"QUARRY_REAP_INTERVAL"`
	// LeaseRetention is how long ended leases stay readable (410, not 404)
	// before they are purged (default 24 h).
	LeaseRetention time.Duration `envconfig:"QUARRY_LEASE_RETENTION"`
	// OrphanInterval is how often the providers are listed to find tasks
	// that no record accounts for (default 30 s); OrphanGrace is how old
	// such a task must be before it is stopped (default 2 min), and with
	// OrphanDryRun it is only logged.
	OrphanInterval time.Duration `envconfig:"QUARRY_ORPHAN_INTERVAL"`
	OrphanGrace    time.Duration `envconfig:"QUARRY_ORPHAN_GRACE"`
	OrphanDryRun   bool          `envconfig:"QUARRY_ORPHAN_DRY_RUN"`
	// HealthTimeout bounds one agent health check or fence (default 2 s).
	HealthTimeout time.Duration `envconfig:"QUARRY_HEALTH_TIMEOUT"`
	// HealthCheckInterval is how often each ready task's agent is checked
	// (default 30 s); after HealthFailures failed checks in a row (default
	// 2) the task is replaced.
	HealthCheckInterval time.Duration `envconfig:"QUARRY_HEALTH_CHECK_INTERVAL"`
	HealthFailures      int           `envconfig:"QUARRY_HEALTH_FAILURES"`
	// InitTimeout bounds the agent's /v1/init after a claim (default 10 s).
	InitTimeout time.Duration `envconfig:"QUARRY_INIT_TIMEOUT"`
	// AcquireTimeout bounds one Acquire that has to cold-start a task or
	// wait for a launching one (default 2 min); the pool's startup timeout
	// bounds the launch itself.
	AcquireTimeout time.Duration `envconfig:"QUARRY_ACQUIRE_TIMEOUT"`
	// AcquireAttempts bounds how many tasks one Acquire tries when agents
	// fail their init or launches fail (default 3).
	AcquireAttempts int `envconfig:"QUARRY_ACQUIRE_ATTEMPTS"`
	// StoreTimeout bounds each lease-store call of background work (default
	// 5 s); ProviderTimeout each provider call (default 30 s).
	StoreTimeout    time.Duration `envconfig:"QUARRY_STORE_TIMEOUT"`
	ProviderTimeout time.Duration `envconfig:"QUARRY_PROVIDER_TIMEOUT"`
	// LaunchBackoff is the pause after a failed launch before the
	// reconciler launches again in that pool; it doubles with each failure
	// in a row up to LaunchBackoffMax (defaults 1 s and 1 min).
	LaunchBackoff    time.Duration `envconfig:"QUARRY_LAUNCH_BACKOFF"`
	LaunchBackoffMax time.Duration `envconfig:"QUARRY_LAUNCH_BACKOFF_MAX"`
	// MaxListLeases bounds what List returns (default 1000).
	MaxListLeases int `envconfig:"QUARRY_MAX_LIST_LEASES"`
	// ReplicaID names this gateway replica as the holder of the locks that
	// gate background work (default DefaultReplicaID(): host name, pid and
	// a random suffix). Replicas sharing a store must use distinct ids.
	ReplicaID string `envconfig:"QUARRY_REPLICA_ID"`
	// LockTTL is how long a replica holds the lock of a background job (a
	// pool's reconciler, the reaper, the orphan sweep) after its last pass;
	// a replica that dies holding a lock is replaced once it expires. The
	// lock of a job is held for at least twice the job's interval (default
	// 15 s).
	LockTTL time.Duration `envconfig:"QUARRY_LOCK_TTL"`
	// LaunchChunk is how many tasks one ReserveTasks and one provider
	// Launch carry (default 50; never more than the store takes at once,
	// ReserveLimiter); LaunchBudget bounds the tasks one refill reserves
	// (default 500); LaunchConcurrency the Launch calls of a pool in flight
	// on this replica (default 4).
	LaunchChunk       int `envconfig:"QUARRY_LAUNCH_CHUNK"`
	LaunchBudget      int `envconfig:"QUARRY_LAUNCH_BUDGET"`
	LaunchConcurrency int `envconfig:"QUARRY_LAUNCH_CONCURRENCY"`
	// LaunchQueueTimeout is how long a reserved task may wait for its
	// Launch call to return (queued behind the provider's rate limits)
	// before it is given up (default 5 min); its startup deadline (the
	// pool's startup_timeout_seconds) starts when the provider launched it.
	LaunchQueueTimeout time.Duration `envconfig:"QUARRY_LAUNCH_QUEUE_TIMEOUT"`
	// SweepInterval is how often at the most a walk over a pool's tasks
	// starts (default 30 s): it gives up launches past their deadline,
	// finishes stopping tasks, health-checks ready tasks and, for providers
	// without task events, describes ready and leased tasks. SweepBudget
	// bounds the records one pass walks (default 500); DescribeRate the
	// Describe calls per second of a provider's walks and starts on this
	// replica (default 10).
	SweepInterval time.Duration `envconfig:"QUARRY_SWEEP_INTERVAL"`
	SweepBudget   int           `envconfig:"QUARRY_SWEEP_BUDGET"`
	DescribeRate  float64       `envconfig:"QUARRY_DESCRIBE_RATE"`
	// AcquireQueue bounds the acquires of one pool that wait on this
	// replica for a task (default 10000); beyond it an acquire fails at
	// once with no capacity.
	AcquireQueue int `envconfig:"QUARRY_ACQUIRE_QUEUE"`
	// EventQueue bounds the task events (providers.Watcher) waiting to be
	// handled (default 4096); events beyond it are dropped, and the next
	// walks describe that provider's tasks again.
	EventQueue int `envconfig:"QUARRY_EVENT_QUEUE"`
	// OrphanBudget bounds the task records one orphan-sweep pass walks
	// (default 2000).
	OrphanBudget int `envconfig:"QUARRY_ORPHAN_BUDGET"`
	// LeaseCacheTTL is how long a lease read from the store may serve the
	// lease lookups of this replica (never past the lease's ExpiresAt;
	// dropped at once when this replica ends or renews the lease). Default
	// 1 s; a negative value disables the cache. At most 1 min.
	LeaseCacheTTL time.Duration `envconfig:"QUARRY_LEASE_CACHE_TTL"`
	// ImageAllow are the rules of which images each API key may ask for
	// (on top of its class's images patterns): PATTERN (every key) or
	// OWNER=PATTERN (the key whose owner id is OWNER); empty: the classes'
	// patterns alone decide. Comma-separated in the variable.
	ImageAllow []string `envconfig:"QUARRY_IMAGE_ALLOW"`
	// ImagePrepareTimeout bounds how long a load of an on-demand pool
	// waits for its image's preparation (a pull; a task definition's
	// registration; default 15 min); each acquire still waits at most its
	// own timeout. A preparation still running then goes on under its lock
	// (up to an hour, or this when longer), so no replica starts it again.
	ImagePrepareTimeout time.Duration `envconfig:"QUARRY_IMAGE_PREPARE_TIMEOUT"`
	// PoolPage is how many pool records a class pass reads (default 100):
	// a class of N on-demand pools is tended every N/PoolPage passes.
	PoolPage int `envconfig:"QUARRY_POOL_PAGE"`
	// MaxOnDemandPools bounds the on-demand pools one replica holds in
	// memory (default 10000); past it, a new pool is refused with no
	// capacity.
	MaxOnDemandPools int `envconfig:"QUARRY_MAX_ONDEMAND_POOLS"`
	// PrefetchQueue bounds the images of prefetches waiting for their
	// preparation (default 10000); PrefetchConcurrency is how many are
	// prepared at once (default 8; a provider bounds its own pulls too).
	PrefetchQueue       int `envconfig:"QUARRY_PREFETCH_QUEUE"`
	PrefetchConcurrency int `envconfig:"QUARRY_PREFETCH_CONCURRENCY"`
	// PoolTouchInterval is how often a replica writes the acquires it
	// counted per on-demand pool into their records (default 5 s): their
	// last use and rate, which the class's warm policy and idle end read.
	PoolTouchInterval time.Duration `envconfig:"QUARRY_POOL_TOUCH_INTERVAL"`
	// CountReads bounds the reads of a pool's counts (CountTasks) that a
	// replica's waiting acquires and refills have in flight at once
	// (default 64): with thousands of pools waiting for launches, their
	// polls wait for a slot instead of swamping the store, so every read
	// answers within QUARRY_STORE_TIMEOUT and launches, which need the
	// store too, go on at the provider's rate.
	CountReads int `envconfig:"QUARRY_COUNT_READS"`
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.GatewayID == "" {
		c.GatewayID = "quarry"
	}
	defaults.Set(&c.ReconcileInterval, 2*time.Second)
	defaults.Set(&c.ReapInterval, 5*time.Second)
	defaults.Set(&c.LeaseRetention, 24*time.Hour)
	defaults.Set(&c.OrphanInterval, 30*time.Second)
	defaults.Set(&c.OrphanGrace, 2*time.Minute)
	defaults.Set(&c.HealthTimeout, 2*time.Second)
	defaults.Set(&c.HealthCheckInterval, 30*time.Second)
	defaults.Set(&c.InitTimeout, 10*time.Second)
	defaults.Set(&c.AcquireTimeout, 2*time.Minute)
	defaults.Set(&c.StoreTimeout, 5*time.Second)
	defaults.Set(&c.ProviderTimeout, 30*time.Second)
	defaults.Set(&c.LaunchBackoff, time.Second)
	defaults.Set(&c.LaunchBackoffMax, time.Minute)
	if c.HealthFailures == 0 {
		c.HealthFailures = 2
	}
	if c.AcquireAttempts == 0 {
		c.AcquireAttempts = 3
	}
	if c.MaxListLeases == 0 {
		c.MaxListLeases = 1000
	}
	if c.ReplicaID == "" {
		c.ReplicaID = DefaultReplicaID()
	}
	defaults.Set(&c.LockTTL, 15*time.Second)
	defaults.Set(&c.LeaseCacheTTL, time.Second)
	defaults.Set(&c.LaunchChunk, 50)
	defaults.Set(&c.LaunchBudget, 500)
	defaults.Set(&c.LaunchConcurrency, 4)
	defaults.Set(&c.LaunchQueueTimeout, 5*time.Minute)
	defaults.Set(&c.SweepInterval, 30*time.Second)
	defaults.Set(&c.SweepBudget, 500)
	defaults.Set(&c.DescribeRate, 10)
	defaults.Set(&c.AcquireQueue, 10000)
	defaults.Set(&c.EventQueue, 4096)
	defaults.Set(&c.OrphanBudget, 2000)
	defaults.Set(&c.ImagePrepareTimeout, 15*time.Minute)
	defaults.Set(&c.PoolPage, 100)
	defaults.Set(&c.MaxOnDemandPools, 10000)
	defaults.Set(&c.PrefetchQueue, 10000)
	defaults.Set(&c.PrefetchConcurrency, 8)
	defaults.Set(&c.PoolTouchInterval, 5*time.Second)
	defaults.Set(&c.CountReads, 64)
	return c
}

// Validate checks c after defaults. Errors name the QUARRY_ variable.
func (c Config) Validate() error {
	var errs []error
	positive := func(name string, d time.Duration) {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("QUARRY_%s: %s is not a positive duration", name, d))
		}
	}
	positive("RECONCILE_INTERVAL", c.ReconcileInterval)
	positive("REAP_INTERVAL", c.ReapInterval)
	positive("LEASE_RETENTION", c.LeaseRetention)
	positive("ORPHAN_INTERVAL", c.OrphanInterval)
	positive("HEALTH_TIMEOUT", c.HealthTimeout)
	positive("HEALTH_CHECK_INTERVAL", c.HealthCheckInterval)
	positive("INIT_TIMEOUT", c.InitTimeout)
	positive("ACQUIRE_TIMEOUT", c.AcquireTimeout)
	positive("STORE_TIMEOUT", c.StoreTimeout)
	positive("PROVIDER_TIMEOUT", c.ProviderTimeout)
	positive("LAUNCH_BACKOFF", c.LaunchBackoff)
	positive("LOCK_TTL", c.LockTTL)
	positive("LAUNCH_QUEUE_TIMEOUT", c.LaunchQueueTimeout)
	positive("SWEEP_INTERVAL", c.SweepInterval)
	positive("IMAGE_PREPARE_TIMEOUT", c.ImagePrepareTimeout)
	positive("POOL_TOUCH_INTERVAL", c.PoolTouchInterval)
	for _, n := range []struct {
		name string
		v    int
	}{
		{"LAUNCH_CHUNK", c.LaunchChunk}, {"LAUNCH_BUDGET", c.LaunchBudget}, {"LAUNCH_CONCURRENCY", c.LaunchConcurrency},
		{"SWEEP_BUDGET", c.SweepBudget}, {"ACQUIRE_QUEUE", c.AcquireQueue}, {"EVENT_QUEUE", c.EventQueue}, {"ORPHAN_BUDGET", c.OrphanBudget},
		{"POOL_PAGE", c.PoolPage}, {"MAX_ONDEMAND_POOLS", c.MaxOnDemandPools},
		{"PREFETCH_QUEUE", c.PrefetchQueue}, {"PREFETCH_CONCURRENCY", c.PrefetchConcurrency},
		{"COUNT_READS", c.CountReads},
	} {
		if n.v < 1 {
			errs = append(errs, fmt.Errorf("QUARRY_%s: %d; at least 1", n.name, n.v))
		}
	}
	if !(c.DescribeRate > 0) {
		errs = append(errs, fmt.Errorf("QUARRY_DESCRIBE_RATE: %v; a positive number of calls per second", c.DescribeRate))
	}
	if c.LeaseCacheTTL > maxLeaseCacheTTL {
		errs = append(errs, fmt.Errorf("QUARRY_LEASE_CACHE_TTL: %s is above the maximum %s", c.LeaseCacheTTL, maxLeaseCacheTTL))
	}
	if !replicaIDPattern.MatchString(c.ReplicaID) {
		errs = append(errs, fmt.Errorf("QUARRY_REPLICA_ID: %q must be 1-128 letters, digits, '.', '_', ':' or '-'", c.ReplicaID))
	}
	if c.OrphanGrace < 0 {
		errs = append(errs, fmt.Errorf("QUARRY_ORPHAN_GRACE: %s is negative", c.OrphanGrace))
	}
	if c.LaunchBackoffMax < c.LaunchBackoff {
		errs = append(errs, fmt.Errorf("QUARRY_LAUNCH_BACKOFF_MAX: %s is below QUARRY_LAUNCH_BACKOFF %s", c.LaunchBackoffMax, c.LaunchBackoff))
	}
	if c.HealthFailures < 1 {
		errs = append(errs, fmt.Errorf("QUARRY_HEALTH_FAILURES: %d; at least 1", c.HealthFailures))
	}
	if c.AcquireAttempts < 1 || c.AcquireAttempts > 10 {
		errs = append(errs, fmt.Errorf("QUARRY_ACQUIRE_ATTEMPTS: %d; between 1 and 10", c.AcquireAttempts))
	}
	if c.MaxListLeases < 1 {
		errs = append(errs, fmt.Errorf("QUARRY_MAX_LIST_LEASES: %d; at least 1", c.MaxListLeases))
	}
	if !labelKeyPattern.MatchString(c.GatewayID) || len(c.GatewayID) > 63 {
		errs = append(errs, fmt.Errorf("QUARRY_GATEWAY_ID: %q must be 1-63 letters, digits, '.', '_' or '-'", c.GatewayID))
	}
	return errors.Join(errs...)
}
