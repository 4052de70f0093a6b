package warmpool

import (
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/quarryhq/quarry/providers"
)

// pool is the manager's in-memory companion of one configured pool. Nothing
// in it matters across restarts: it holds wake-ups, launch backoff, health
// check bookkeeping and which launching tasks are this replica's cold
// starts.
type pool struct {
	cfg      PoolConfig
	provider providers.Provider
	spec     providers.Spec
	digest   string // cfg.SpecDigest(): the tasks this pool hands out
	relayURL string // providers.SandboxRelay's answer for spec ("": the gateway's own address)
	log      *slog.Logger
	// metric is the pool label of its metrics: its name, or "class/<class>"
	// for an on-demand pool (thousands of pools would be thousands of series).
	metric string
	// lock gates its passes (its own, or its class's for an on-demand
	// pool), and interval is how often its periodic pass runs.
	lock     string
	interval time.Duration
	// od is the on-demand pool's state; nil for a configured pool.
	od      *odState
	wake    chan struct{} // buffered 1: wakes the reconciler
	changed notifier      // a task became ready or a slot was freed
	queue   *acquireQueue // acquires of this replica waiting for a task
	start   *starter      // launched tasks of this replica, until ready
	// passMu: one pass or refill of the pool at a time on this replica, so
	// that a refill counts what the one before reserved. An on-demand
	// pool's passes run on its class's loop, its wake-up refills on its own.
	passMu sync.Mutex

	mu         sync.Mutex
	coldStarts map[string]bool         // launching tasks an Acquire of this replica will claim
	health     map[string]*healthState // ready task id → check bookkeeping
	failures   int                     // launch failures in a row
	nextLaunch time.Time               // no reconciler launch before (real time)
	launching  int                     // Launch calls of this replica in flight
	launchMax  int                     // at most that many (launchConcurrency)
	local      int                     // tasks this replica reserved that are not yet ready or given up
	blockedBy  string                  // why the last refill could not proceed ("": it could)
	walk       walkState               // the reconciler's walk over the pool's tasks
	resync     bool                    // events were dropped: the next walk describes
	// staleLeaseSeen: a lease on a task of another configuration was
	// logged (noteStaleLease logs the first only).
	staleLeaseSeen bool
}

// walkState is where the reconciler's walk over a pool's tasks is.
type walkState struct {
	active   bool
	cursor   string
	started  time.Time // real time the current (or last) walk started
	cycle    int       // walks started
	describe bool      // this walk describes ready and leased tasks
}

type healthState struct {
	next     time.Time // real time of the next check
	failures int       // failed checks in a row
	cycle    int       // the last walk that saw the task ready
}

// poolSpec is what the provider launches the tasks of pool cfg with; class
// is the class of an on-demand pool ("" for a configured one).
func poolSpec(cfg PoolConfig, class string) providers.Spec {
	// The provider attaches the quarry.* labels itself (the gateway id from
	// its own config); the spec carries only the pool's own labels.
	return providers.Spec{
		Pool: cfg.Name, Image: cfg.Image, CPU: cfg.CPU, MemoryMB: int(cfg.Memory), DiskMB: int(cfg.Disk),
		Env: maps.Clone(cfg.Env), Labels: maps.Clone(cfg.Labels), Options: cfg.ProviderOptions(), Class: class,
	}
}

func newPool(cfg PoolConfig, prov providers.Provider, log *slog.Logger, mcfg Config) *pool {
	spec := poolSpec(cfg, "")
	var relayURL string
	if r, ok := prov.(providers.SandboxRelay); ok {
		relayURL = r.SandboxRelayURL(spec)
	}
	return &pool{
		cfg:        cfg,
		provider:   prov,
		spec:       spec,
		digest:     cfg.SpecDigest(),
		relayURL:   relayURL,
		log:        log.With("pool", cfg.Name),
		metric:     cfg.Name,
		lock:       lockPoolPrefix + cfg.Name,
		interval:   mcfg.ReconcileInterval,
		wake:       make(chan struct{}, 1),
		coldStarts: map[string]bool{},
		health:     map[string]*healthState{},
		queue:      newAcquireQueue(mcfg.AcquireQueue),
		start:      newStarter(),
		launchMax:  launchConcurrency(prov, mcfg),
	}
}

// launchConcurrency is how many Launch calls of one pool may be in flight
// on this replica: Config.LaunchConcurrency, or more where the provider has
// more start slots (providers.StartSlots) than that many chunks fill. A
// Launch returns when its tasks run, so with ECS's 1,900 slots and chunks
// of 50 the pool needs 38 calls in flight to launch at AWS's 20/s; 4 would
// hold it at 200 starting, about 2 launches/s with Fargate's starts.
func launchConcurrency(prov providers.Provider, cfg Config) int {
	n := cfg.LaunchConcurrency
	if s, ok := prov.(providers.StartSlots); ok && cfg.LaunchChunk > 0 {
		n = max(n, (s.StartSlots()+cfg.LaunchChunk-1)/cfg.LaunchChunk)
	}
	return n
}

// startLaunch takes one of the pool's max Launch calls in flight; false
// when all are taken.
func (p *pool) startLaunch() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.launching >= p.launchMax {
		return false
	}
	p.launching++
	return true
}

// endLaunch gives a Launch call back; unstarted of its tasks did not start
// (they are settled now).
func (p *pool) endLaunch(unstarted int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.launching--
	p.local -= unstarted
}

func (p *pool) addLocal(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.local += n
}

func (p *pool) endLocal(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.local -= n
}

// localTasks is how many tasks this replica has reserved that are not yet
// ready or given up.
func (p *pool) localTasks() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.local
}

// blocked records why a refill that wanted want more tasks could not
// proceed (reason "" when it could): it counts quarry_refill_blocked_total
// and logs once when a streak starts, naming the limit, and once when it
// ends.
func (p *pool) blocked(m *Manager, reason string, want int, args ...any) {
	p.mu.Lock()
	was := p.blockedBy
	p.blockedBy = reason
	p.mu.Unlock()
	if reason != "" {
		m.metrics.refillBlocked.WithLabelValues(p.metric, reason).Inc()
	}
	if reason == was {
		return
	}
	log := p.log.With(append([]any{"wanted", want}, args...)...)
	switch reason {
	case "":
		log.Info("refill proceeds again", "was", was)
	case blockedMaxTotal:
		log.Warn("refill blocked: the pool is at max_total; waiting acquires wait for a task to free", "max_total", p.cfg.MaxTotal, "waiting", p.queue.len())
	case blockedStore:
		log.Warn("refill blocked: the lease store refused the reservation; backing off (QUARRY_LAUNCH_BACKOFF)")
	case blockedBackoff:
		log.Warn("refill blocked: launches failed; backing off before the next (QUARRY_LAUNCH_BACKOFF, QUARRY_LAUNCH_BACKOFF_MAX)")
	case blockedInFlight:
		log.Debug("refill held: QUARRY_LAUNCH_CONCURRENCY launch calls are in flight", "limit", p.launchMax)
	}
}

// poke wakes the reconciler without blocking.
func (p *pool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *pool) startupTimeout() time.Duration {
	return time.Duration(p.cfg.StartupTimeoutSeconds) * time.Second
}

func (p *pool) setColdStart(id string, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.coldStarts[id] = true
	} else {
		delete(p.coldStarts, id)
	}
}

func (p *pool) isColdStart(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.coldStarts[id]
}

// takeResync reports (and clears) whether the next walk must describe.
func (p *pool) takeResync() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.resync
	p.resync = false
	return r
}

// endWalk drops the health bookkeeping of the tasks that walk cycle did
// not see ready (leased, stopped, or deleted by another replica).
func (p *pool) endWalk(cycle int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, h := range p.health {
		if h.cycle < cycle {
			delete(p.health, id)
		}
	}
}

// coldStartCount is how many launching tasks this replica's cold starts
// will claim.
func (p *pool) coldStartCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.coldStarts)
}

// setResync makes the next walk describe the pool's tasks (events were
// dropped).
func (p *pool) setResync() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resync = true
}

// forget drops the bookkeeping of a deleted task.
func (p *pool) forget(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.health, id)
}

// launchResult records a reconciler launch outcome for the backoff.
func (p *pool) launchResult(ok bool, base, maxBackoff time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ok {
		p.failures = 0
		p.nextLaunch = time.Time{}
		return
	}
	p.failures++
	d := base
	for i := 1; i < p.failures && d < maxBackoff; i++ {
		d *= 2
	}
	p.nextLaunch = time.Now().Add(min(d, maxBackoff))
}

func (p *pool) launchAllowed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !time.Now().Before(p.nextLaunch)
}

// notifier lets goroutines wait for the next broadcast: wait returns a
// channel that the next broadcast closes. The zero value is ready to use.
type notifier struct {
	mu sync.Mutex
	ch chan struct{}
}

func (n *notifier) wait() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch == nil {
		n.ch = make(chan struct{})
	}
	return n.ch
}

func (n *notifier) broadcast() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch != nil {
		close(n.ch)
		n.ch = nil
	}
}
