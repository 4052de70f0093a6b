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
	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"

	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/internal/clock"
	"github.com/quarryhq/quarry/providers"
)

// Deps are the Manager's collaborators.
type Deps struct {
	Store Store
	// Providers by name ("process", "docker", "ecs"); every pool's Provider
	// must be one of them.
	Providers map[string]providers.Provider
	// Pools as loaded by LoadPools, with Provider already defaulted by cmd/.
	Pools []PoolConfig
	// Classes are the pool classes of on-demand pools (LoadPoolsFile), with
	// Provider defaulted by cmd/; none serves no image on demand.
	Classes []ClassConfig
	Agents  Agents
	Logger  *slog.Logger          // nil discards logs
	Clock   clock.Clock           // nil is clock.System
	Metrics prometheus.Registerer // nil registers no metrics
	// LeaseEnv, when set, returns variables added to a new lease's env
	// (under the request's own, which it overrides): per-lease settings that
	// depend on the lease id, such as the model relay's URL and token. It is
	// called once per lease id, before the claim. relayURL is where the
	// pool's sandboxes reach the model relay from inside
	// (providers.SandboxRelay), or "" when they reach the gateway's own
	// address.
	LeaseEnv func(leaseID, relayURL string) map[string]string
	// ExtraProvider, when set, builds a provider that no pool uses, on the
	// first need of it: to describe and stop the tasks it made for an
	// earlier configuration of a pool (its provider changed). The manager
	// closes what it built at Close. nil (or an error): such tasks are
	// reported once and left running, their records kept.
	ExtraProvider func(name string) (providers.Provider, error)
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
	clock     clock.Clock
	leaseEnv  func(leaseID, relayURL string) map[string]string
	metrics   *metrics
	pools     map[string]*pool // the configured pools, fixed after New
	names     []string         // pool names in configuration order

	// classes are the pool classes, fixed after New; od the on-demand
	// pools this replica has loaded (odMu guards it); loads the loads in
	// flight, one per pool; touches the acquires not yet counted in their
	// pool records (touchMu guards it); imageRules QUARRY_IMAGE_ALLOW's.
	classes    map[string]*classState
	classNames []string
	odMu       sync.RWMutex
	od         map[string]*pool
	loads      singleflight.Group
	preps      singleflight.Group // image preparations running on this replica, by pool (prepareAndRecord)
	touchMu    sync.Mutex
	touches    map[string]touch
	imageRules []imageRule
	prefetchQ  chan prefetchJob // images waiting for a prefetch worker
	countReads chan struct{}    // a slot per count read in flight (countTasks)

	// orphans is where the orphan sweep's cycle is; only the sweep
	// goroutine uses it.
	orphans orphanSweep
	// describeLimits hold each provider's Describe rate (Config.DescribeRate).
	describeLimits map[string]*rate.Limiter
	// watchers says which providers deliver task events now.
	watchMu  sync.Mutex
	watchers map[string]bool
	// lastPurge is when the reaper last purged ended leases (manager
	// clock); only the reaper goroutine uses it.
	lastPurge time.Time
	// locks are the background-work locks this replica holds; cache the
	// leases it read recently.
	locks lockSet
	cache *leaseCache

	// extraProvider builds providers no pool uses (Deps.ExtraProvider);
	// extras are those built, extraFailed the builds that failed lately,
	// reported the unstoppable tasks logged. extraMu guards them.
	extraProvider func(name string) (providers.Provider, error)
	extraMu       sync.Mutex
	extras        map[string]providers.Provider
	extraFailed   map[string]extraFailure
	extrasClosed  bool
	extraLimits   map[string]*rate.Limiter // their describe rates
	reported      map[string]bool

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
	if err := errors.Join(ValidatePools(deps.Pools), ValidateClasses(deps.Classes, deps.Pools)); err != nil {
		return nil, fmt.Errorf("warm pool: %w", err)
	}
	rules, err := parseImageRules(cfg.ImageAllow)
	if err != nil {
		return nil, fmt.Errorf("warm pool config: %w", err)
	}
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	clk := deps.Clock
	if clk == nil {
		clk = clock.System{}
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
		pools[pc.Name] = newPool(pc, prov, log, cfg)
		names = append(names, pc.Name)
	}
	classes, classNames, err := newClasses(deps.Classes, provs)
	if err != nil {
		return nil, err
	}
	limits := make(map[string]*rate.Limiter, len(provs))
	for name := range provs {
		limits[name] = newDescribeLimit(cfg)
	}
	bg, cancel := context.WithCancel(context.Background())
	return &Manager{
		cfg: cfg, store: deps.Store, providers: provs, agents: deps.Agents, log: log.With("replica", cfg.ReplicaID), clock: clk,
		leaseEnv: deps.LeaseEnv, metrics: met, pools: pools, names: names, orphans: orphanSweep{seen: map[string]time.Time{}, stopped: map[string]bool{}},
		describeLimits: limits, watchers: map[string]bool{},
		locks: lockSet{held: map[string]bool{}, failing: map[string]bool{}}, cache: newLeaseCache(cfg.LeaseCacheTTL), bg: bg, cancel: cancel,
		extraProvider: deps.ExtraProvider, extras: map[string]providers.Provider{}, extraFailed: map[string]extraFailure{}, extraLimits: map[string]*rate.Limiter{}, reported: map[string]bool{},
		classes: classes, classNames: classNames, od: map[string]*pool{}, touches: map[string]touch{}, imageRules: rules,
		prefetchQ: make(chan prefetchJob, cfg.PrefetchQueue), countReads: make(chan struct{}, cfg.CountReads),
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
	var c TaskCounts
	for _, name := range m.names {
		pc, err := m.store.CountTasks(ctx, name)
		if err != nil {
			m.mu.Lock()
			m.started = false // Start may be tried again
			m.mu.Unlock()
			return fmt.Errorf("start warm pool manager: count the tasks of pool %s: %w", name, err)
		}
		c.Ready, c.Launching, c.Leased, c.Stopping = c.Ready+pc.Ready, c.Launching+pc.Launching, c.Leased+pc.Leased, c.Stopping+pc.Stopping
	}
	m.log.Info("warm pools starting", "pools", len(m.pools), "ready", c.Ready, "launching", c.Launching,
		"leased", c.Leased, "stopping", c.Stopping)
	for _, name := range m.names {
		p := m.pools[name]
		m.goBackground(CallerReconcile, func(ctx context.Context) { m.reconcileLoop(ctx, p) })
	}
	images := false // a class whose provider runs images: a class of the process provider has no pools
	for _, name := range m.classNames {
		cs := m.classes[name]
		if _, ok := cs.provider.(providers.ImagePreparer); ok {
			images = true
			m.goBackground(CallerReconcile, func(ctx context.Context) { m.classLoop(ctx, cs) })
		}
	}
	for _, p := range m.allPools() { // on-demand pools loaded before Start
		if p.od != nil {
			m.startPoolLoop(p)
		}
	}
	if images {
		m.goBackground(CallerAcquire, m.touchLoop)
		for range m.cfg.PrefetchConcurrency {
			m.goBackground(CallerAcquire, m.prefetchWorker)
		}
	}
	for _, name := range m.providersInUse() {
		if w, ok := m.providers[name].(providers.Watcher); ok {
			m.goBackground(CallerEvents, func(ctx context.Context) { m.watchEvents(ctx, name, w) })
		}
	}
	m.goBackground(CallerReaper, func(ctx context.Context) {
		m.every(ctx, m.cfg.ReapInterval, m.locked(lockReaper, m.cfg.ReapInterval, m.reap))
	})
	m.goBackground(CallerOrphans, func(ctx context.Context) {
		m.every(ctx, m.cfg.OrphanInterval, m.locked(lockOrphans, m.cfg.OrphanInterval, m.sweepOrphans))
	})
	return nil
}

// newDescribeLimit is one provider's describe rate (Config.DescribeRate).
func newDescribeLimit(cfg Config) *rate.Limiter {
	return rate.NewLimiter(rate.Limit(cfg.DescribeRate), max(1, int(cfg.DescribeRate)))
}

// providersInUse returns the names of the providers that pools use,
// sorted.
func (m *Manager) providersInUse() []string {
	inUse := map[string]bool{}
	for _, p := range m.pools {
		inUse[p.cfg.Provider] = true
	}
	for _, cs := range m.classes {
		inUse[cs.cfg.Provider] = true
	}
	return slices.Sorted(maps.Keys(inUse))
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
		m.closeExtras(context.WithoutCancel(ctx))
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

// Pools returns every configured pool with its current task counts, in
// configuration order: one counter read per pool (CountTasks), whatever
// the number of tasks.
func (m *Manager) Pools(ctx context.Context) ([]PoolStatus, error) {
	ctx = ContextWithCaller(ctx, CallerPools)
	out := make([]PoolStatus, 0, len(m.names))
	for _, name := range m.names {
		c, err := m.store.CountTasks(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("pool status %s: %w", name, err)
		}
		out = append(out, PoolStatus{
			PoolConfig: m.pools[name].cfg,
			Ready:      c.Ready, Launching: c.Launching, Leased: c.Leased, Stopping: c.Stopping,
		})
	}
	return out, nil
}
