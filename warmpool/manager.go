package warmpool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/providers"
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
	// LeaseCacheTTL is how long a lease read from the store may serve the
	// lease lookups of this replica (never past the lease's ExpiresAt;
	// dropped at once when this replica ends or renews the lease). Default
	// 1 s; a negative value disables the cache. At most 1 min.
	LeaseCacheTTL time.Duration `envconfig:"QUARRY_LEASE_CACHE_TTL"`
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.GatewayID == "" {
		c.GatewayID = "quarry"
	}
	def(&c.ReconcileInterval, 2*time.Second)
	def(&c.ReapInterval, 5*time.Second)
	def(&c.LeaseRetention, 24*time.Hour)
	def(&c.OrphanInterval, 30*time.Second)
	def(&c.OrphanGrace, 2*time.Minute)
	def(&c.HealthTimeout, 2*time.Second)
	def(&c.HealthCheckInterval, 30*time.Second)
	def(&c.InitTimeout, 10*time.Second)
	def(&c.AcquireTimeout, 2*time.Minute)
	def(&c.StoreTimeout, 5*time.Second)
	def(&c.ProviderTimeout, 30*time.Second)
	def(&c.LaunchBackoff, time.Second)
	def(&c.LaunchBackoffMax, time.Minute)
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
	def(&c.LockTTL, 15*time.Second)
	def(&c.LeaseCacheTTL, time.Second)
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

// Deps are the Manager's collaborators.
type Deps struct {
	Store Store
	// Providers by name ("process", "docker", "ecs"); every pool's Provider
	// must be one of them.
	Providers map[string]providers.Provider
	// Pools as loaded by LoadPools, with Provider already defaulted by cmd/.
	Pools   []PoolConfig
	Agents  Agents
	Logger  *slog.Logger          // nil discards logs
	Clock   Clock                 // nil is real time
	Metrics prometheus.Registerer // nil registers no metrics
	// LeaseEnv, when set, returns variables added to a new lease's env
	// (under the request's own, which it overrides): per-lease settings that
	// depend on the lease id, such as the model relay's URL and token. It is
	// called once per lease id, before the claim.
	LeaseEnv func(leaseID string) map[string]string
}

// Manager runs the warm pools: it hands out leases (Acquire), renews and
// ends them, keeps each pool at min_warm ready tasks (a reconciler per
// pool), ends expired leases (the reaper) and stops tasks that nothing
// accounts for (the orphan sweep).
//
// Everything that matters lives in the store: a new Manager on the same
// store (after a restart, or on another gateway replica) serves every live
// lease. Its methods are safe for concurrent use; several Managers may share
// one store, and every ownership decision is a conditional store write.
type Manager struct {
	cfg       Config
	store     Store
	providers map[string]providers.Provider
	agents    Agents
	log       *slog.Logger
	clock     Clock
	leaseEnv  func(string) map[string]string
	metrics   *metrics
	pools     map[string]*pool // fixed after New
	names     []string         // pool names in configuration order

	// orphanSeen is when the orphan sweep first saw a provider task that
	// reports no creation time; only the sweep goroutine uses it.
	orphanSeen map[string]time.Time
	// lastPurge is when the reaper last purged ended leases (manager
	// clock); only the reaper goroutine uses it.
	lastPurge time.Time
	// locks are the background-work locks this replica holds; cache the
	// leases it read recently.
	locks lockSet
	cache *leaseCache

	bg     context.Context // canceled by Close; background work runs under it
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex // guards started, closed and wg.Add
	started bool
	closed  bool
	runOnce sync.Mutex // serializes RunOnce
}

// New validates cfg and deps and builds a Manager. It starts nothing (see
// Start) and makes no I/O.
func New(cfg Config, deps Deps) (*Manager, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("warm pool config: %w", err)
	}
	switch {
	case deps.Store == nil:
		return nil, errors.New("warm pool: Deps.Store is nil")
	case deps.Agents == nil:
		return nil, errors.New("warm pool: Deps.Agents is nil")
	}
	if err := ValidatePools(deps.Pools); err != nil {
		return nil, fmt.Errorf("warm pool: %w", err)
	}
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	clock := deps.Clock
	if clock == nil {
		clock = realClock{}
	}
	met, err := newMetrics(deps.Metrics)
	if err != nil {
		return nil, err
	}
	provs := map[string]providers.Provider{}
	for name, prov := range deps.Providers {
		if prov != nil {
			provs[name] = prov
		}
	}
	pools := make(map[string]*pool, len(deps.Pools))
	var names []string
	for i, pc := range deps.Pools {
		field := fmt.Sprintf("pools[%d].provider", i)
		if pc.Provider == "" {
			return nil, badinput.New(field, "pool %q names no provider (cmd/ sets the default provider before New)", pc.Name)
		}
		prov, ok := provs[pc.Provider]
		if !ok {
			return nil, badinput.New(field, "pool %q uses provider %q, which is not configured (configured: %v)", pc.Name, pc.Provider, slices.Sorted(maps.Keys(provs)))
		}
		pools[pc.Name] = newPool(pc, prov, log)
		names = append(names, pc.Name)
	}
	bg, cancel := context.WithCancel(context.Background())
	return &Manager{
		cfg: cfg, store: deps.Store, providers: provs, agents: deps.Agents, log: log.With("replica", cfg.ReplicaID), clock: clock,
		leaseEnv: deps.LeaseEnv, metrics: met, pools: pools, names: names, orphanSeen: map[string]time.Time{},
		locks: lockSet{held: map[string]bool{}, failing: map[string]bool{}}, cache: newLeaseCache(cfg.LeaseCacheTTL), bg: bg, cancel: cancel,
	}, nil
}

// Start checks that the store answers, then starts one reconciler per pool,
// the reaper and the orphan sweep. ctx bounds the start only; Close stops
// the background work. Start succeeds once; after an error (the store did
// not answer) it may be called again.
//
// Every replica on a store runs the same loops, but each pass runs only on
// the replica that holds its lock (Store.TryLock, named by
// Config.ReplicaID): a pool's reconciler (its full pass and its refills),
// the reaper and the orphan sweep. Acquire, Heartbeat, Release and the
// other calls never wait for a lock.
func (m *Manager) Start(ctx context.Context) error {
	ctx = ContextWithCaller(ctx, CallerLifecycle)
	m.mu.Lock()
	switch {
	case m.closed:
		m.mu.Unlock()
		return errors.New("start warm pool manager: it was closed")
	case m.started:
		m.mu.Unlock()
		return errors.New("start warm pool manager: already started")
	}
	m.started = true
	m.mu.Unlock()
	tasks, err := m.store.ListTasks(ctx, "")
	if err != nil {
		m.mu.Lock()
		m.started = false // Start may be tried again
		m.mu.Unlock()
		return fmt.Errorf("start warm pool manager: read tasks: %w", err)
	}
	c := countTasks(tasks)
	m.log.Info("warm pools starting", "pools", len(m.pools), "ready", c.ready, "launching", c.launching,
		"leased", c.leased, "stopping", c.stopping)
	for _, name := range m.names {
		p := m.pools[name]
		m.goBackground(CallerReconcile, func(ctx context.Context) { m.reconcileLoop(ctx, p) })
	}
	m.goBackground(CallerReaper, func(ctx context.Context) {
		m.every(ctx, m.cfg.ReapInterval, m.locked(lockReaper, m.cfg.ReapInterval, m.reap))
	})
	m.goBackground(CallerOrphans, func(ctx context.Context) {
		m.every(ctx, m.cfg.OrphanInterval, m.locked(lockOrphans, m.cfg.OrphanInterval, m.sweepOrphans))
	})
	return nil
}

// Close stops the background work and waits for it (or for ctx), then
// releases the locks this replica holds, so that another replica takes the
// background work over at once. It never stops tasks: leases outlive the
// gateway process. Acquire and the other calls keep working after Close,
// without background refills. Calling Close again returns nil.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	started := m.started
	m.cancel()
	m.mu.Unlock()
	done := make(chan struct{})
	go func() {
		m.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		if started {
			m.unlockAll(ContextWithCaller(context.WithoutCancel(ctx), CallerLifecycle))
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close warm pool manager: %w", ctx.Err())
	}
}

// goBackground runs fn in a goroutine owned by the manager (Close cancels
// its ctx and waits for it); its ctx carries caller (CallerOf). It returns
// false, running nothing, once the manager is closed.
func (m *Manager) goBackground(caller string, fn func(ctx context.Context)) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		fn(ContextWithCaller(m.bg, caller))
	}()
	return true
}

// every runs fn now and then every interval until ctx ends.
func (m *Manager) every(ctx context.Context, interval time.Duration, fn func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		fn(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Get returns lease id of owner, in any state. A lease of another owner is
// ErrNotFound, like an unknown one. An active lease whose ExpiresAt has
// passed is returned as expired (the reaper will end it so).
//
// An active lease may come from this replica's lease cache (at most
// Config.LeaseCacheTTL old, never past its ExpiresAt): a lease that
// another replica ended within that time may still read as active here,
// but its agent, fenced or stopped when the lease ended, refuses it.
func (m *Manager) Get(ctx context.Context, id, owner string) (Lease, error) {
	return m.get(ContextWithCaller(ctx, CallerGet), id, owner)
}

func (m *Manager) get(ctx context.Context, id, owner string) (Lease, error) {
	l, ok := m.cache.get(id, m.clock.Now())
	if !ok {
		mark := m.cache.reading()
		var err error
		if l, err = m.store.GetLease(ctx, id); err != nil {
			return Lease{}, fmt.Errorf("get lease: %w", err)
		}
		m.cache.putRead(l, m.clock.Now(), mark)
	}
	if l.Owner != owner {
		return Lease{}, fmt.Errorf("get lease %s: %w", id, ErrNotFound)
	}
	return m.present(l), nil
}

// Ready reports whether the lease store answers: one lease read (of an id
// that never exists). It returns the store's error otherwise
// (ErrUnavailable when the store is down or throttles).
func (m *Manager) Ready(ctx context.Context) error {
	_, err := m.store.GetLease(ContextWithCaller(ctx, CallerReady), readinessProbeID)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("read the lease store: %w", err)
	}
	return nil
}

// readinessProbeID is the lease id Ready reads: a valid key that no lease
// has (lease ids are "sbx-" and 26 base32 characters).
const readinessProbeID = LeaseIDPrefix + "readiness-probe"

// Heartbeat moves the lease's expiry to now + its duration. ErrNotFound
// for an unknown lease or another owner's; ErrLeaseEnded (with the lease)
// once it ended or expired. The renewal is a conditional store write,
// never answered from the lease cache.
func (m *Manager) Heartbeat(ctx context.Context, id, owner string) (Lease, error) {
	ctx = ContextWithCaller(ctx, CallerHeartbeat)
	l, err := m.get(ctx, id, owner)
	if err != nil {
		return Lease{}, err
	}
	if l.State != LeaseActive {
		return l, fmt.Errorf("heartbeat lease %s: it is %s: %w", id, l.State, ErrLeaseEnded)
	}
	d := l.Duration
	if d <= 0 {
		d = time.Duration(m.leaseSecondsDefault(l.Pool)) * time.Second
	}
	now := m.clock.Now()
	done := m.cache.writeLease(id)
	renewed, err := m.store.RenewLease(ctx, id, owner, now.Add(d), now)
	done()
	if err == nil {
		m.cache.put(renewed, now)
	}
	return m.leaseResult("heartbeat", id, renewed, err)
}

// leaseResult maps a store answer about lease id for its owner: with
// ErrLeaseEnded the lease comes back too, and ErrLeaseNotHeld becomes
// ErrNotFound (another owner's lease does not exist for the caller).
func (m *Manager) leaseResult(action, id string, l Lease, err error) (Lease, error) {
	switch {
	case err == nil:
		return l, nil
	case errors.Is(err, ErrLeaseEnded):
		return m.present(l), fmt.Errorf("%s lease %s: %w", action, id, err)
	case errors.Is(err, ErrLeaseNotHeld):
		return Lease{}, fmt.Errorf("%s lease %s: %w", action, id, ErrNotFound)
	default:
		return Lease{}, fmt.Errorf("%s lease %s: %w", action, id, err)
	}
}

// Release ends the lease as released and stops its task, which is never
// reused. ErrNotFound for an unknown lease or another owner's. A lease that
// has ended already (or expired) is returned with ErrLeaseEnded. Stopping
// the task is best effort: if it fails, the task stays "stopping" and the
// reconciler finishes the job.
func (m *Manager) Release(ctx context.Context, id, owner string) (Lease, error) {
	ctx = ContextWithCaller(ctx, CallerRelease)
	l, err := m.get(ctx, id, owner)
	if err != nil {
		return Lease{}, err
	}
	if l.State != LeaseActive {
		return l, fmt.Errorf("release lease %s: it is %s: %w", id, l.State, ErrLeaseEnded)
	}
	done := m.cache.writeLease(id)
	ended, err := m.store.EndLease(ctx, id, LeaseEnd{State: LeaseReleased, Reason: "released by its owner", Now: m.clock.Now(), Owner: owner})
	done()
	if err != nil {
		return m.leaseResult("release", id, ended, err)
	}
	m.retire(context.WithoutCancel(ctx), ended, true)
	return ended, nil
}

// List returns leases matching f, newest first, at most Config.MaxListLeases
// (or f.Limit when lower). Leases are presented as Get does.
func (m *Manager) List(ctx context.Context, f LeaseFilter) ([]Lease, error) {
	if f.Limit <= 0 || f.Limit > m.cfg.MaxListLeases {
		f.Limit = m.cfg.MaxListLeases
	}
	ls, err := m.store.ListLeases(ContextWithCaller(ctx, CallerList), f)
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	out := ls[:0]
	for _, l := range ls {
		l = m.present(l)
		if f.State == "" || l.State == f.State {
			out = append(out, l)
		}
	}
	return out, nil
}

// Pools returns every configured pool with its current task counts, in
// configuration order.
func (m *Manager) Pools(ctx context.Context) ([]PoolStatus, error) {
	ctx = ContextWithCaller(ctx, CallerPools)
	out := make([]PoolStatus, 0, len(m.names))
	for _, name := range m.names {
		tasks, err := m.store.ListTasks(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("pool status %s: %w", name, err)
		}
		c := countTasks(tasks)
		out = append(out, PoolStatus{
			PoolConfig: m.pools[name].cfg,
			Ready:      c.ready, Launching: c.launching, Leased: c.leased, Stopping: c.stopping,
		})
	}
	return out, nil
}

// CheckTask asks the provider whether the task of lease l still runs; the
// gateway calls it when the task's agent is unreachable. If the task
// stopped (or its record is gone), the lease ends as lost with the
// provider's reason and the ended lease is returned; otherwise the lease is
// returned as it is. A lease that is no longer active is returned as it is.
// Errors are store or provider failures; the caller has already checked
// that l belongs to its owner.
func (m *Manager) CheckTask(ctx context.Context, l Lease) (Lease, error) {
	ctx = ContextWithCaller(ctx, CallerCheckTask)
	done := m.cache.writeLease(l.ID) // the agent did not answer: read the lease afresh from now on
	defer done()
	cur, err := m.store.GetLease(ctx, l.ID)
	if err != nil {
		return l, fmt.Errorf("check task of lease %s: %w", l.ID, err)
	}
	if cur.State != LeaseActive {
		return m.present(cur), nil
	}
	reason, err := m.taskGone(ctx, cur)
	if err != nil || reason == "" {
		return m.present(cur), err
	}
	ended, err := m.store.EndLease(ctx, cur.ID, LeaseEnd{State: LeaseLost, Reason: reason, Now: m.clock.Now()})
	switch {
	case errors.Is(err, ErrLeaseEnded):
		return m.present(ended), nil
	case err != nil:
		return m.present(cur), fmt.Errorf("end lost lease %s: %w", cur.ID, err)
	}
	m.log.Warn("lease lost: its task stopped", "pool", cur.Pool, "lease", cur.ID, "task", cur.TaskID, "reason", reason)
	m.retire(context.WithoutCancel(ctx), ended, false)
	return ended, nil
}

// taskGone returns why the task of an active lease no longer runs, or ""
// when it runs.
func (m *Manager) taskGone(ctx context.Context, l Lease) (string, error) {
	rec, ok, err := m.findTask(ctx, l.Pool, l.TaskID)
	switch {
	case err != nil:
		return "", err
	case !ok:
		return "its task record is gone", nil
	case rec.ProviderID == "":
		return "its task was never launched", nil
	}
	prov, ok := m.providers[rec.Provider]
	if !ok {
		return "", fmt.Errorf("task %s: provider %q is not configured", rec.ID, rec.Provider)
	}
	pctx, cancel := context.WithTimeout(ctx, m.cfg.ProviderTimeout)
	defer cancel()
	described, err := prov.Describe(pctx, []string{rec.ProviderID})
	if err != nil {
		return "", fmt.Errorf("describe task %s: %w", rec.ID, err)
	}
	for _, t := range described {
		if t.ID == rec.ProviderID && t.State != providers.TaskStopped {
			return "", nil
		}
		if t.ID == rec.ProviderID {
			return stoppedReason(t), nil
		}
	}
	return "the provider does not know its task", nil
}

// findTask returns the record of task id in pool: one read when the store
// is a TaskGetter, else a listing of the pool's tasks.
func (m *Manager) findTask(ctx context.Context, pool, id string) (TaskRecord, bool, error) {
	if g, ok := m.store.(TaskGetter); ok {
		rec, err := g.GetTask(ctx, id)
		switch {
		case errors.Is(err, ErrNotFound):
			return TaskRecord{}, false, nil
		case err != nil:
			return TaskRecord{}, false, fmt.Errorf("read task %s: %w", id, err)
		}
		return rec, rec.Pool == pool, nil
	}
	tasks, err := m.store.ListTasks(ctx, pool)
	if err != nil {
		return TaskRecord{}, false, fmt.Errorf("read tasks of pool %s: %w", pool, err)
	}
	for _, t := range tasks {
		if t.ID == id {
			return t, true, nil
		}
	}
	return TaskRecord{}, false, nil
}

// retire finishes an ended lease: it stops the task (fencing its agent
// first when the agent may still answer) and deletes its record. Best
// effort with bounded calls: whatever fails is logged and left to the
// reconciler (the task is "stopping").
func (m *Manager) retire(ctx context.Context, l Lease, fence bool) {
	log := m.log.With("pool", l.Pool, "lease", l.ID, "task", l.TaskID)
	sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
	rec, ok, err := m.findTask(sctx, l.Pool, l.TaskID)
	cancel()
	if err != nil {
		log.Warn("retire task: the reconciler will stop it", "err", err)
		return
	}
	if !ok || rec.State != TaskStopping {
		return // the reconciler got there first
	}
	if !fence {
		rec.AgentURL = ""
	}
	if err := m.stopTask(ctx, rec, "lease "+string(l.State)); err != nil {
		log.Warn("stop task: the reconciler will retry", "err", err)
	}
}

// stopTask stops a stopping task in its provider (finding it by name when
// its provider id is unknown) and deletes its record. A task that was
// leased is fenced first, when rec.AgentURL is set: an init with a higher
// generation makes its agent refuse a stale gateway's calls while the
// provider stops it (best effort; the caller clears AgentURL for a task
// known to be dead).
func (m *Manager) stopTask(ctx context.Context, rec TaskRecord, reason string) error {
	prov, ok := m.providers[rec.Provider]
	if !ok {
		return fmt.Errorf("stop task %s: provider %q is not configured", rec.ID, rec.Provider)
	}
	if rec.LeaseID != "" && rec.AgentURL != "" {
		fctx, cancel := context.WithTimeout(ctx, m.cfg.HealthTimeout)
		_, err := m.agents.Init(fctx, rec.AgentURL, rec.AgentToken, agentapi.InitRequest{LeaseID: rec.LeaseID, Generation: rec.Generation + 1})
		cancel()
		if err != nil {
			m.log.Debug("fence agent", "pool", rec.Pool, "task", rec.ID, "err", err)
		}
	}
	pctx, cancel := context.WithTimeout(ctx, m.cfg.ProviderTimeout)
	defer cancel()
	ids := []string{rec.ProviderID}
	if rec.ProviderID == "" {
		found, err := prov.List(pctx, rec.Pool)
		if err != nil {
			return fmt.Errorf("find task %s by name: %w", rec.ID, err)
		}
		ids = ids[:0]
		for _, t := range found {
			if t.Name == rec.ID || t.Labels[providers.LabelTask] == rec.ID {
				ids = append(ids, t.ID)
			}
		}
	}
	for _, id := range ids {
		if err := prov.Stop(pctx, id, reason); err != nil {
			return fmt.Errorf("stop task %s: %w", rec.ID, err)
		}
	}
	sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
	defer cancel()
	if err := m.store.DeleteTask(sctx, rec.ID); err != nil {
		return fmt.Errorf("delete task %s: %w", rec.ID, err)
	}
	if p := m.pools[rec.Pool]; p != nil {
		p.forget(rec.ID)
		p.changed.broadcast()
		p.poke() // a slot is free: the pool may refill
	}
	return nil
}

// present returns l as a client should see it: an active lease past its
// expiry is shown as expired.
func (m *Manager) present(l Lease) Lease {
	if l.State == LeaseActive && !l.ExpiresAt.After(m.clock.Now()) {
		l.State = LeaseExpired
		l.Reason = "not renewed before it expired"
		l.EndedAt = l.ExpiresAt
	}
	return l
}

func (m *Manager) leaseSecondsDefault(pool string) int {
	if p := m.pools[pool]; p != nil {
		return p.cfg.DefaultLeaseSeconds
	}
	return DefaultLeaseSeconds
}

// stoppedReason says why a provider task stopped.
func stoppedReason(t providers.Task) string {
	if t.Reason == "" {
		return "its task stopped"
	}
	return "its task stopped: " + t.Reason
}

// taskCounts counts a pool's tasks by state.
type taskCounts struct{ ready, launching, leased, stopping int }

func countTasks(tasks []TaskRecord) taskCounts {
	var c taskCounts
	for _, t := range tasks {
		switch t.State {
		case TaskReady:
			c.ready++
		case TaskLaunching:
			c.launching++
		case TaskLeased:
			c.leased++
		case TaskStopping:
			c.stopping++
		}
	}
	return c
}
