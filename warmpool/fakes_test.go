package warmpool_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/providers"
)

// fakeClock is a settable clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// fakeProvider "runs" tasks in memory. Its function fields script launches:
// OnLaunch runs before a launch (an error fails it, nothing starts), and
// StartDelay makes Launch take that long (honouring ctx).
type fakeProvider struct {
	clock *fakeClock

	mu         sync.Mutex
	OnLaunch   func(ctx context.Context, spec providers.Spec, names []string) error
	StartDelay time.Duration
	// KeepStopped makes List keep reporting a task Stop stopped, as ECS
	// reports a stopped task for about an hour.
	KeepStopped bool
	tasks       map[string]*providers.Task // by provider id
	removed     map[string]bool            // stopped through Stop: no longer listed, as a real backend
	seq         int
	running     int
	maxRunning  int
	launched    int
	listCalls   int
	describes   int
	stops       []string
}

var _ providers.Provider = (*fakeProvider)(nil)

func newFakeProvider(clock *fakeClock) *fakeProvider {
	return &fakeProvider{clock: clock, tasks: map[string]*providers.Task{}, removed: map[string]bool{}}
}

func (p *fakeProvider) Launch(ctx context.Context, spec providers.Spec, names []string) ([]providers.Task, error) {
	p.mu.Lock()
	onLaunch, delay := p.OnLaunch, p.StartDelay
	p.mu.Unlock()
	if onLaunch != nil {
		if err := onLaunch(ctx, spec, names); err != nil {
			return nil, err
		}
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []providers.Task
	for _, name := range names {
		p.seq++
		labels := maps.Clone(spec.Labels)
		if labels == nil {
			labels = map[string]string{}
		}
		labels[providers.LabelManaged] = "true"
		labels[providers.LabelPool] = spec.Pool
		labels[providers.LabelTask] = name
		labels[providers.LabelGateway] = "quarry" // as a provider configured with the default gateway id
		t := &providers.Task{
			ID: fmt.Sprintf("proc-%d", p.seq), Name: name, Pool: spec.Pool, State: providers.TaskRunning,
			AgentURL: "fake://" + name, AgentToken: "tok-" + name, Labels: labels, CreatedAt: p.clock.Now(),
		}
		p.tasks[t.ID] = t
		p.running++
		p.launched++
		p.maxRunning = max(p.maxRunning, p.running)
		out = append(out, *t)
	}
	return out, nil
}

func (p *fakeProvider) Describe(_ context.Context, ids []string) ([]providers.Task, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.describes++
	out := make([]providers.Task, 0, len(ids))
	for _, id := range ids {
		if t, ok := p.tasks[id]; ok {
			out = append(out, *t)
			continue
		}
		out = append(out, providers.Task{ID: id, State: providers.TaskStopped, Reason: "not found"})
	}
	return out, nil
}

func (p *fakeProvider) Stop(_ context.Context, id, reason string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stops = append(p.stops, id)
	if !p.KeepStopped {
		p.removed[id] = true
	}
	if t, ok := p.tasks[id]; ok && t.State != providers.TaskStopped {
		t.State, t.Reason = providers.TaskStopped, reason
		p.running--
	}
	return nil
}

func (p *fakeProvider) List(_ context.Context, pool string) ([]providers.Task, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.listCalls++
	var out []providers.Task
	for id, t := range p.tasks {
		if (pool == "" || t.Pool == pool) && !p.removed[id] {
			out = append(out, *t)
		}
	}
	return out, nil
}

// kill makes a task die on its own (OOM, crash).
func (p *fakeProvider) kill(id, reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t := p.tasks[id]; t != nil && t.State != providers.TaskStopped {
		t.State, t.Reason = providers.TaskStopped, reason
		p.running--
	}
}

// add makes the provider run a task that no record knows (an orphan).
func (p *fakeProvider) add(t providers.Task) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t.State == "" {
		t.State = providers.TaskRunning
	}
	p.tasks[t.ID] = &t
	if t.State != providers.TaskStopped {
		p.running++
	}
}

// stopCalls returns the ids Stop was called with.
func (p *fakeProvider) stopCalls() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.stops)
}

func (p *fakeProvider) task(id string) (providers.Task, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.tasks[id]
	if !ok {
		return providers.Task{}, false
	}
	return *t, true
}

// byName finds the provider task launched under a task record id.
func (p *fakeProvider) byName(name string) (providers.Task, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range p.tasks {
		if t.Name == name {
			return *t, true
		}
	}
	return providers.Task{}, false
}

func (p *fakeProvider) counts() (running, maxRunning, launched, listCalls int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.running, p.maxRunning, p.launched, p.listCalls
}

func (p *fakeProvider) setOnLaunch(fn func(ctx context.Context, spec providers.Spec, names []string) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.OnLaunch = fn
}

func (p *fakeProvider) setStartDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.StartDelay = d
}

func (p *fakeProvider) describeCalls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.describes
}

// watchingProvider is a fakeProvider with task events (providers.Watcher):
// Watch forwards what the test sends on events until ctx ends, or returns
// the error the test sends on fail.
type watchingProvider struct {
	*fakeProvider
	events  chan providers.TaskEvent
	fail    chan error
	watches chan struct{} // closed when a Watch runs
	once    sync.Once
}

var _ providers.Watcher = (*watchingProvider)(nil)

func newWatchingProvider(prov *fakeProvider) *watchingProvider {
	return &watchingProvider{fakeProvider: prov, events: make(chan providers.TaskEvent), fail: make(chan error, 1), watches: make(chan struct{})}
}

func (w *watchingProvider) Watch(ctx context.Context, events chan<- providers.TaskEvent) error {
	w.once.Do(func() { close(w.watches) })
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-w.fail:
			return err
		case ev := <-w.events:
			select {
			case events <- ev:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// fakeAgents answers for the agents of the fake provider's running tasks.
// HealthFunc and InitFunc, when set, decide instead (nil error = default).
type fakeAgents struct {
	prov *fakeProvider
	more []*fakeProvider // other providers whose tasks' agents answer too

	mu         sync.Mutex
	HealthFunc func(url string) error
	InitFunc   func(url string, req agentapi.InitRequest) error
	inits      map[string][]agentapi.InitRequest // by url
	health     int
}

func newFakeAgents(prov *fakeProvider) *fakeAgents {
	return &fakeAgents{prov: prov, inits: map[string][]agentapi.InitRequest{}}
}

var errRefused = errors.New("connection refused")

// reachable reports whether url is the agent of a running task.
func (a *fakeAgents) reachable(url string) bool {
	name := strings.TrimPrefix(url, "fake://")
	for _, p := range append([]*fakeProvider{a.prov}, a.more...) {
		if t, ok := p.byName(name); ok {
			return t.State == providers.TaskRunning
		}
	}
	return false
}

func (a *fakeAgents) Health(ctx context.Context, url, token string) (agentapi.Health, error) {
	a.mu.Lock()
	a.health++
	fn := a.HealthFunc
	a.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return agentapi.Health{}, err
	}
	if fn != nil {
		if err := fn(url); err != nil {
			return agentapi.Health{}, err
		}
	}
	if !a.reachable(url) || token != "tok-"+strings.TrimPrefix(url, "fake://") {
		return agentapi.Health{}, errRefused
	}
	return agentapi.Health{Status: "ok", Version: agentapi.Version}, nil
}

func (a *fakeAgents) Init(ctx context.Context, url, token string, req agentapi.InitRequest) (agentapi.Health, error) {
	a.mu.Lock()
	fn := a.InitFunc
	a.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return agentapi.Health{}, err
	}
	if fn != nil {
		if err := fn(url, req); err != nil {
			return agentapi.Health{}, err
		}
	}
	if !a.reachable(url) {
		return agentapi.Health{}, errRefused
	}
	a.mu.Lock()
	a.inits[url] = append(a.inits[url], req)
	a.mu.Unlock()
	return agentapi.Health{Status: "ok", Version: agentapi.Version, LeaseID: req.LeaseID, Generation: req.Generation}, nil
}

func (a *fakeAgents) initsOf(url string) []agentapi.InitRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]agentapi.InitRequest(nil), a.inits[url]...)
}

func (a *fakeAgents) setHealthFunc(fn func(url string) error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.HealthFunc = fn
}

func (a *fakeAgents) setInitFunc(fn func(url string, req agentapi.InitRequest) error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.InitFunc = fn
}
