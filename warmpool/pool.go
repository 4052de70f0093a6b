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
	relayURL string // providers.SandboxRelay's answer for spec ("": the gateway's own address)
	log      *slog.Logger
	wake     chan struct{} // buffered 1: wakes the reconciler
	changed  notifier      // a task became ready or a slot was freed

	mu         sync.Mutex
	coldStarts map[string]bool         // launching tasks an Acquire of this replica will claim
	health     map[string]*healthState // ready task id → check bookkeeping
	failures   int                     // launch failures in a row
	nextLaunch time.Time               // no reconciler launch before (real time)
}

type healthState struct {
	next     time.Time // real time of the next check
	failures int       // failed checks in a row
}

func newPool(cfg PoolConfig, prov providers.Provider, log *slog.Logger) *pool {
	// The provider attaches the quarry.* labels itself (the gateway id from
	// its own config); the spec carries only the pool's own labels.
	labels := maps.Clone(cfg.Labels)
	spec := providers.Spec{
		Pool: cfg.Name, Image: cfg.Image, CPU: cfg.CPU, MemoryMB: int(cfg.Memory), DiskMB: int(cfg.Disk),
		Env: maps.Clone(cfg.Env), Labels: labels, Options: cfg.ProviderOptions(),
	}
	var relayURL string
	if r, ok := prov.(providers.SandboxRelay); ok {
		relayURL = r.SandboxRelayURL(spec)
	}
	return &pool{
		cfg:        cfg,
		provider:   prov,
		spec:       spec,
		relayURL:   relayURL,
		log:        log.With("pool", cfg.Name),
		wake:       make(chan struct{}, 1),
		coldStarts: map[string]bool{},
		health:     map[string]*healthState{},
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
