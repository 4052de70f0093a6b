package warmpool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/quarryhq/quarry/providers"
)

const (
	// readyPollMin and readyPollMax bound the pause between two health
	// checks of a starting agent (it doubles from the first to the second).
	readyPollMin = 10 * time.Millisecond
	readyPollMax = 500 * time.Millisecond
	// describeGap is the shortest time between two describes of one
	// starting task (while it has no agent address, or its agent fails).
	describeGap = time.Second
	// startChecks bounds the health checks of a pool's starter at once.
	startChecks = 32
)

// probe is one starting task under watch: launched, not yet healthy.
type probe struct {
	rec          TaskRecord
	next         time.Time     // real time of its next check
	delay        time.Duration // pause after a failed check
	lastDescribe time.Time
	lastErr      error
	chunk        *chunkResult // the launch it came from (nil: a cold start)
}

// chunkResult settles one launch for the pool's launch backoff: once
// every task it launched is ready or given up, the backoff learns whether
// all went well.
type chunkResult struct {
	mu      sync.Mutex
	pending int
	ok      bool
}

// done records one task of the chunk and reports, when it was the last,
// whether the whole chunk went well.
func (c *chunkResult) done(ok bool) (last, allOK bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending--
	c.ok = c.ok && ok
	return c.pending == 0, c.ok
}

// starter makes a pool's launched tasks ready, batch by batch: one
// goroutine per pool (while it has tasks) describes the tasks without an
// agent address (100 ids a call, each at most once a describeGap) and
// health-checks the others (startChecks at once, each backing off from
// readyPollMin to readyPollMax), and marks each ready as soon as its agent
// answers. No goroutine or poller per task.
type starter struct {
	mu      sync.Mutex
	tasks   map[string]*probe // owned by the starter's goroutine, but for the map itself
	nudged  map[string]bool   // tasks an event concerns: check and describe them now
	running bool
	wake    chan struct{} // buffered 1
}

func newStarter() *starter {
	return &starter{tasks: map[string]*probe{}, nudged: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// tracks reports whether task id is starting under this replica's watch.
func (s *starter) tracks(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.tasks[id]
	return ok
}

func (s *starter) size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.tasks)
}

// nudge makes the starter check task id (describing it) at its next
// round; false when it does not start it.
func (s *starter) nudge(id string) bool {
	s.mu.Lock()
	_, ok := s.tasks[id]
	if ok {
		s.nudged[id] = true
	}
	s.mu.Unlock()
	if ok {
		signal(s.wake)
	}
	return ok
}

// startAll hands launched tasks to the pool's starter.
func (m *Manager) startAll(p *pool, recs []TaskRecord, chunk *chunkResult) {
	s := p.start
	now := time.Now()
	s.mu.Lock()
	for _, r := range recs {
		s.tasks[r.ID] = &probe{rec: r, next: now, delay: readyPollMin, chunk: chunk}
	}
	run := !s.running
	s.running = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	if run && !m.goBackground(CallerReconcile, func(ctx context.Context) { m.runStarter(ctx, p) }) {
		s.mu.Lock()
		s.running = false
		s.mu.Unlock()
	}
}

// runStarter checks the pool's starting tasks until none is left or ctx
// ends (the tasks left are given up at their deadlines by the walks).
func (m *Manager) runStarter(ctx context.Context, p *pool) {
	s := p.start
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			s.mu.Lock()
			s.running = false
			s.mu.Unlock()
			return
		case <-timer.C:
		case <-s.wake:
		}
		now := time.Now()
		var due []*probe
		next := now.Add(readyPollMax)
		s.mu.Lock()
		if len(s.tasks) == 0 {
			s.running = false
			s.mu.Unlock()
			return
		}
		for id := range s.nudged {
			if pr := s.tasks[id]; pr != nil {
				pr.next, pr.lastDescribe = time.Time{}, time.Time{}
				if pr.lastErr == nil {
					pr.lastErr = errNudged
				}
			}
			delete(s.nudged, id)
		}
		for _, pr := range s.tasks {
			if !pr.next.After(now) {
				due = append(due, pr)
			} else if pr.next.Before(next) {
				next = pr.next
			}
		}
		s.mu.Unlock()
		healthy, failed := m.check(ctx, p, due)
		for _, pr := range healthy {
			s.drop(pr.rec.ID)
			_, err := m.markReady(ctx, p, pr.rec)
			if err != nil {
				m.failLaunch(ctx, p, pr.rec, err)
				p.queue.fail(err, 1)
			}
			m.settle(p, pr, err == nil)
		}
		for pr, err := range failed {
			s.drop(pr.rec.ID)
			m.failLaunch(ctx, p, pr.rec, err)
			p.queue.fail(err, 1)
			m.settle(p, pr, false)
		}
		done := make(map[*probe]bool, len(healthy))
		for _, pr := range healthy {
			done[pr] = true
		}
		later := time.Now()
		for _, pr := range due {
			if _, gone := failed[pr]; gone || done[pr] {
				continue
			}
			pr.next = later.Add(pr.delay)
			pr.delay = min(2*pr.delay, readyPollMax)
			if pr.next.Before(next) {
				next = pr.next
			}
		}
		timer.Reset(max(time.Until(next), readyPollMin))
	}
}

func (s *starter) drop(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tasks, id)
	delete(s.nudged, id)
}

// settle counts a started task as settled (ready or given up) in its pool:
// its launch chunk's backoff and this replica's tasks in flight.
func (m *Manager) settle(p *pool, pr *probe, ok bool) {
	p.endLocal(1)
	if pr.chunk != nil {
		if last, allOK := pr.chunk.done(ok); last {
			p.launchResult(allOK, m.cfg.LaunchBackoff, m.cfg.LaunchBackoffMax)
		}
	}
	p.poke()
}

// check runs one round of checks on starting tasks: the ones without an
// agent address, or whose agent failed, are described (batched, at most
// once a describeGap each, rate-limited) to learn the address or that the
// task stopped; then the agents with an address are health-checked
// (startChecks at once). It returns the tasks whose agents are healthy
// (probe.rec.State set ready, not yet written) and those that failed for
// good (stopped, incompatible, past their launch deadline) with why; the
// others keep their last error. A probe's rec is kept up to date.
func (m *Manager) check(ctx context.Context, p *pool, probes []*probe) (healthy []*probe, failed map[*probe]error) {
	failed = map[*probe]error{}
	var describe []*probe
	now := time.Now()
	for _, pr := range probes {
		if (pr.rec.AgentURL == "" || pr.lastErr != nil) && now.Sub(pr.lastDescribe) >= describeGap {
			describe = append(describe, pr)
		}
	}
	for start := 0; start < len(describe); start += describeBatch {
		batch := describe[start:min(start+describeBatch, len(describe))]
		ids := make([]string, len(batch))
		for i, pr := range batch {
			ids[i] = pr.rec.ProviderID
			pr.lastDescribe = now
		}
		described, err := m.describe(ctx, p.cfg.Provider, p.provider, ids)
		for _, pr := range batch {
			t, ok := described[pr.rec.ProviderID]
			switch {
			case err != nil:
				pr.lastErr = err
			case !ok:
				pr.lastErr = fmt.Errorf("describe task %s: not in the answer", pr.rec.ProviderID)
			case t.State == providers.TaskStopped:
				failed[pr] = fmt.Errorf("the task stopped while starting: %s", stoppedReason(t))
			case pr.rec.AgentURL == "" && t.AgentURL != "":
				rec := pr.rec
				rec.AgentURL, rec.AgentToken = t.AgentURL, t.AgentToken
				sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
				r, err := m.store.UpdateTask(sctx, rec, rec.State)
				cancel()
				if err != nil {
					failed[pr] = fmt.Errorf("record the agent address: %w", err)
					continue
				}
				pr.rec = r
			}
		}
	}
	var mu sync.Mutex
	var g errgroup.Group
	g.SetLimit(startChecks)
	for _, pr := range probes {
		if _, gone := failed[pr]; gone || pr.rec.AgentURL == "" {
			continue
		}
		g.Go(func() error {
			hctx, cancel := context.WithTimeout(ctx, m.cfg.HealthTimeout)
			h, err := m.agents.Health(hctx, pr.rec.AgentURL, pr.rec.AgentToken)
			cancel()
			if err == nil {
				err = compatibleAgent(h)
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				pr.lastErr = nil
				healthy = append(healthy, pr)
			case errors.Is(err, errIncompatible):
				failed[pr] = err
			default:
				pr.lastErr = err
			}
			return nil
		})
	}
	_ = g.Wait() // the functions return nil
	clockNow := m.clock.Now()
	for _, pr := range probes {
		_, gone := failed[pr]
		if gone || pr.lastErr == nil && pr.rec.AgentURL != "" {
			continue
		}
		if !pr.rec.LaunchDeadline.IsZero() && clockNow.After(pr.rec.LaunchDeadline) {
			failed[pr] = fmt.Errorf("the agent was not healthy before the launch deadline: %w", pr.lastErr)
		}
	}
	return healthy, failed
}

// waitReady polls the agent of one launched task until /healthz passes, the
// task stops, its launch deadline passes or ctx ends: the cold start of a
// manager whose starter does not run.
func (m *Manager) waitReady(ctx context.Context, p *pool, rec TaskRecord) (TaskRecord, error) {
	pr := &probe{rec: rec, delay: readyPollMin}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return pr.rec, fmt.Errorf("the agent was not healthy in time (%w): last check: %w", ctx.Err(), pr.lastErr)
		case <-timer.C:
		}
		healthy, failed := m.check(ctx, p, []*probe{pr})
		if err := failed[pr]; err != nil {
			return pr.rec, err
		}
		if len(healthy) > 0 {
			return pr.rec, nil
		}
		timer.Reset(pr.delay)
		pr.delay = min(2*pr.delay, readyPollMax)
	}
}

// describe describes provider tasks (at most describeBatch ids), after
// waiting for the provider's describe rate (Config.DescribeRate), and
// returns them by id.
func (m *Manager) describe(ctx context.Context, name string, prov providers.Provider, ids []string) (map[string]providers.Task, error) {
	m.metrics.describes.WithLabelValues(name).Inc()
	if err := m.describeLimit(name).Wait(ctx); err != nil {
		return nil, fmt.Errorf("describe %d task(s): wait for the describe rate (QUARRY_DESCRIBE_RATE %v/s): %w", len(ids), m.cfg.DescribeRate, err)
	}
	pctx, cancel := context.WithTimeout(ctx, m.cfg.ProviderTimeout)
	defer cancel()
	tasks, err := prov.Describe(pctx, ids)
	if err != nil {
		return nil, fmt.Errorf("describe %d task(s): %w", len(ids), err)
	}
	out := make(map[string]providers.Task, len(tasks))
	for _, t := range tasks {
		out[t.ID] = t
	}
	return out, nil
}

// errNudged is the last error of a starting task that an event concerns:
// it makes the next check describe it.
var errNudged = errors.New("a task event concerns it")
