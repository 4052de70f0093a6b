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
	// describeBatch is how many task ids one Describe call carries (the ECS
	// DescribeTasks limit).
	describeBatch = 100
	// stopConcurrency and healthConcurrency bound the fan-out of one pass.
	stopConcurrency   = 4
	healthConcurrency = 8
	// pageMax is the most records one ListTasksPage call of a walk asks for.
	pageMax = 100
	// refillGap is the shortest time between two refills that wake-ups
	// (not the ticker) start in one pool: a busy pool's acquires wake the
	// reconciler on every call, so a busy pool is refilled at most once a
	// second besides its passes. (A launch takes longer than that.)
	refillGap = time.Second
)

// reconcileLoop reconciles p now and every ReconcileInterval until ctx
// ends, on the replica that holds the pool's lock (the others only try to
// take it on each tick, so one replica takes over when the holder dies and
// its lock expires). Being woken (after an acquire, a launch, a freed slot)
// only refills, at most every refillGap: on the holder for min_warm and its
// waiting acquires, on another replica for its waiting acquires alone
// (which needs no lock: ReserveTasks keeps max_total).
//
// An on-demand pool's periodic passes are the class loop's (classPass, a
// page of pools at a time, on the holder of the class's lock): its own loop
// refills on wake-ups (for its waiting acquires, and on the holder for its
// warm target), drops the pool from a replica that does not use it
// (unloadIdle) every p.interval, and ends when the pool is unloaded
// (p.od.quit).
func (m *Manager) reconcileLoop(ctx context.Context, p *pool) {
	lock := p.lock
	pass := m.locked(lock, p.interval, func(ctx context.Context) { m.reconcile(ctx, p) })
	takeLock := func(ctx context.Context) bool { return m.holdLock(ctx, lock, p.interval) }
	var quit <-chan struct{}
	if p.od != nil {
		pass = func(context.Context) {} // the class pass runs it (classPass)
		takeLock = func(context.Context) bool { return true }
		quit = p.od.quit
	}
	t := time.NewTicker(p.interval)
	defer t.Stop()
	pass(ctx)
	lastRefill := time.Now()
	var putOff <-chan time.Time // a wake-up's refill, put off until refillGap has passed
	refill := func() {
		putOff, lastRefill = nil, time.Now()
		holder := m.holds(lock) && takeLock(ctx)
		if holder || p.queue.len() > 0 || p.warmHere() {
			p.passMu.Lock()
			m.countAndRefill(ctx, p, holder)
			p.passMu.Unlock()
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-quit:
			return
		case <-t.C:
			if p.od != nil && m.unloadIdle(p) {
				return
			}
			pass(ctx)
			if m.holds(lock) { // the pass refilled
				putOff, lastRefill = nil, time.Now()
			}
		case <-p.wake:
			waiting := p.queue.len()
			switch wait := time.Until(lastRefill.Add(refillGap)); {
			case waiting > p.localTasks():
				refill() // acquires wait that nothing launches for yet: no gap
			case putOff != nil || !m.holds(lock) && waiting == 0 && !p.warmHere():
				// A refill is due already, or nothing here to refill for.
			case wait > 0:
				putOff = time.After(wait)
			default:
				refill()
			}
		case <-putOff:
			refill()
		}
	}
}

// reconcile is one pass over a pool, bounded whatever its size: one
// budget of the walk over its tasks (walkPage), then a refill from the
// counts. The pass renews the pool's lock whenever a third of its TTL has
// passed, and stops when it lost it. Every decision is a conditional store
// write, so a pass racing another replica's loses cleanly. Errors are
// logged; the next pass tries again.
func (m *Manager) reconcile(ctx context.Context, p *pool) {
	p.passMu.Lock()
	defer p.passMu.Unlock()
	start := time.Now()
	defer func() { m.metrics.passSeconds.WithLabelValues(p.metric).Observe(time.Since(start).Seconds()) }()
	ctx, renew, done := m.renewing(ctx, p.lock, p.interval)
	defer done()
	if p.od != nil && !p.walk.active {
		// An on-demand pool between walks: one counter read says whether
		// there is anything to walk (most of a class's pools have no task).
		sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
		c, err := m.countTasks(sctx, p)
		cancel()
		if err == nil && c.Total() == 0 {
			m.refill(ctx, p, c, true)
			return
		}
	}
	m.walkPage(ctx, p, renew)
	if renew() {
		m.countAndRefill(ctx, p, true)
	}
}

// countAndRefill reads the pool's counts and refills from them.
func (m *Manager) countAndRefill(ctx context.Context, p *pool, holder bool) {
	sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
	c, err := m.countTasks(sctx, p)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			p.log.Warn("refill: count tasks", "err", err)
		}
		return
	}
	m.refill(ctx, p, c, holder)
}

// walkPage walks the next Config.SweepBudget records of the pool's tasks
// (ListTasksPage); a new walk starts at most every Config.SweepInterval.
// On its pages it gives up launches past their deadline, finishes
// stopping tasks, health-checks ready tasks that are due and, when the
// pool's provider delivers no events (or dropped some), describes ready
// and leased tasks. Only the pool's pass uses p.walk.
func (m *Manager) walkPage(ctx context.Context, p *pool, renew func() bool) {
	w := &p.walk
	if !w.active {
		if !w.started.IsZero() && time.Since(w.started) < m.cfg.SweepInterval {
			return
		}
		w.active, w.cursor, w.started = true, "", time.Now()
		w.cycle++
		w.describe = !m.watching(p.cfg.Provider) || p.takeResync()
	}
	for budget := m.cfg.SweepBudget; budget > 0 && ctx.Err() == nil; {
		sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
		page, err := m.store.ListTasksPage(sctx, p.cfg.Name, w.cursor, min(budget, pageMax))
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				p.log.Warn("reconcile: read tasks", "err", err)
			}
			return // the next pass goes on from the same place
		}
		m.metrics.walked.WithLabelValues(p.metric).Add(float64(len(page.Tasks)))
		m.visit(ctx, p, page.Tasks, w.describe, w.cycle)
		budget -= max(len(page.Tasks), 1)
		if w.cursor = page.Next; w.cursor == "" {
			w.active = false
			p.endWalk(w.cycle)
			return
		}
		if !renew() {
			return
		}
	}
}

// visit handles one page of a walk: stopping tasks are stopped, launches
// past their deadline given up (except this replica's, which its starter
// and cold starts watch), ready and leased tasks described when describe
// is set (a ready one that stopped is replaced, a leased one's lease ends
// as lost), and ready tasks health-checked when due.
func (m *Manager) visit(ctx context.Context, p *pool, recs []TaskRecord, describe bool, cycle int) {
	now := m.clock.Now()
	var stop, unlaunched, running []TaskRecord
	for _, t := range recs {
		switch t.State {
		case TaskStopping:
			if t.ProviderID == "" {
				unlaunched = append(unlaunched, t)
			} else {
				stop = append(stop, t)
			}
		case TaskLaunching:
			if p.start.tracks(t.ID) || p.isColdStart(t.ID) || t.LaunchDeadline.IsZero() || !now.After(t.LaunchDeadline) {
				continue
			}
			if r, ok := m.transition(ctx, p, t, TaskStopping, "it did not become ready before its launch deadline"); ok {
				p.log.Warn("launch deadline passed; stopping the task", "task", t.ID)
				m.metrics.launchFailures.WithLabelValues(p.metric).Inc()
				if r.ProviderID == "" {
					unlaunched = append(unlaunched, r)
				} else {
					stop = append(stop, r)
				}
			}
		case TaskReady, TaskLeased:
			switch {
			case !p.stale(t), t.State == TaskLeased && p.onLayer(t):
			case t.State == TaskLeased:
				m.noteStaleLease(p, t)
			default:
				if r, ok := m.transition(ctx, p, t, TaskStopping, ReasonStaleSpec); ok {
					m.metrics.staleTasks.WithLabelValues(p.metric, "retired").Inc()
					p.log.Info("retiring a ready task launched for another configuration of the pool", "task", t.ID,
						"provider", t.Provider, "spec", t.Spec, "pool_spec", p.digest)
					stop = append(stop, r)
				}
				continue
			}
			if t.ProviderID != "" {
				running = append(running, t)
			}
		}
	}
	alive := running
	if describe {
		var dead []TaskRecord
		dead, alive = m.checkRunning(ctx, p, running)
		stop = append(stop, dead...)
	}
	stop = append(stop, m.checkHealth(ctx, p, alive, cycle)...)
	m.stopAll(ctx, stop)
	m.stopUnlaunched(ctx, p, unlaunched)
}

// stopUnlaunched stops and deletes stopping tasks whose provider id was
// never recorded (a replica died between its launch and its record):
// they are found by name with one listing of the pool's provider tasks.
func (m *Manager) stopUnlaunched(ctx context.Context, p *pool, recs []TaskRecord) {
	byProvider := map[string][]TaskRecord{}
	for _, r := range recs {
		byProvider[r.Provider] = append(byProvider[r.Provider], r)
	}
	for name, recs := range byProvider {
		m.stopUnlaunchedOf(ctx, p, name, recs)
	}
}

// stopUnlaunchedOf stops and deletes the unlaunched stopping tasks of one
// provider.
func (m *Manager) stopUnlaunchedOf(ctx context.Context, p *pool, name string, recs []TaskRecord) {
	prov, err := m.providerOf(name)
	if err != nil {
		for _, r := range recs {
			m.unstoppable(r, err)
		}
		return
	}
	pctx, cancel := context.WithTimeout(ctx, m.cfg.ProviderTimeout)
	found, err := prov.List(pctx, p.cfg.Name)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			p.log.Warn("find unlaunched tasks by name: will retry", "tasks", len(recs), "err", err)
		}
		return
	}
	byName := map[string][]string{}
	for _, t := range found {
		name := t.Name
		if name == "" {
			name = t.Labels[providers.LabelTask]
		}
		byName[name] = append(byName[name], t.ID)
	}
	for _, r := range recs {
		for _, id := range byName[r.ID] {
			m.stopProviderTask(ctx, p, prov, id, r.Reason)
		}
		sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
		err := m.store.DeleteTask(sctx, r)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				p.log.Warn("delete task: will retry", "task", r.ID, "err", err)
			}
			continue
		}
		m.freed(p, r.ID)
	}
}

// renewing returns ctx for a pass that holds lock, a renew function that
// renews the lock when a third of its TTL has passed since the last
// renewal (false, with ctx canceled, once the lock is lost) and a function
// to call when the pass ends.
func (m *Manager) renewing(ctx context.Context, lock string, interval time.Duration) (context.Context, func() bool, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	last := time.Now() // the pass starts just after taking the lock
	every := max(m.cfg.LockTTL, 2*interval) / 3
	return ctx, func() bool {
		if ctx.Err() != nil {
			return false
		}
		if time.Since(last) < every {
			return true
		}
		last = time.Now()
		if !m.holdLock(ctx, lock, interval) {
			m.log.Warn("lost the lock during a long pass; stopping the pass", "lock", lock)
			cancel()
			return false
		}
		return true
	}, cancel
}

// transition moves rec to state with a conditional write. It returns false
// when the write lost a race (the next pass decides again) or failed.
func (m *Manager) transition(ctx context.Context, p *pool, rec TaskRecord, state TaskState, reason string) (TaskRecord, bool) {
	from := rec.State
	rec.State = state
	rec.Reason = reason
	rec.UpdatedAt = m.clock.Now()
	sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
	defer cancel()
	out, err := m.store.UpdateTask(sctx, rec, from)
	if err != nil {
		if !errors.Is(err, ErrConflict) && !errors.Is(err, ErrNotFound) {
			p.log.Warn("update task", "task", rec.ID, "state", state, "err", err)
		}
		return rec, false
	}
	return out, true
}

// checkRunning describes ready and leased tasks in batches. A ready task
// whose provider task stopped becomes stopping; a leased one's lease ends
// as lost with the provider's reason. It returns the tasks to stop and the
// ones still running.
func (m *Manager) checkRunning(ctx context.Context, p *pool, running []TaskRecord) (dead, alive []TaskRecord) {
	byProvider := map[string][]TaskRecord{}
	for _, t := range running {
		byProvider[t.Provider] = append(byProvider[t.Provider], t)
	}
	for name, recs := range byProvider {
		prov, err := m.providerOf(name)
		if err != nil { // left alone: reported when it is to be stopped
			p.log.Debug("cannot describe tasks", "tasks", len(recs), "err", err)
			alive = append(alive, recs...)
			continue
		}
		for start := 0; start < len(recs); start += describeBatch {
			batch := recs[start:min(start+describeBatch, len(recs))]
			ids := make([]string, len(batch))
			for i, r := range batch {
				ids[i] = r.ProviderID
			}
			byID, err := m.describe(ctx, name, prov, ids)
			if err != nil {
				if ctx.Err() == nil {
					p.log.Warn("describe tasks", "err", err)
				}
				alive = append(alive, batch...)
				continue
			}
			for _, r := range batch {
				t, ok := byID[r.ProviderID]
				if !ok || t.State != providers.TaskStopped {
					alive = append(alive, r)
					continue
				}
				if d, ok := m.taskDied(ctx, p, r, stoppedReason(t)); ok {
					dead = append(dead, d)
				}
			}
		}
	}
	return dead, alive
}

// taskDied handles a ready or leased task whose provider task stopped.
func (m *Manager) taskDied(ctx context.Context, p *pool, r TaskRecord, reason string) (TaskRecord, bool) {
	if r.State == TaskReady {
		p.log.Warn("a ready task stopped; replacing it", "task", r.ID, "reason", reason)
		return m.transition(ctx, p, r, TaskStopping, reason)
	}
	sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
	defer cancel()
	done := m.cache.writeLease(r.LeaseID)
	_, err := m.store.EndLease(sctx, r.LeaseID, LeaseEnd{State: LeaseLost, Reason: reason, Now: m.clock.Now()})
	done()
	if err != nil {
		if !errors.Is(err, ErrLeaseEnded) && !errors.Is(err, ErrNotFound) {
			p.log.Warn("end the lease of a dead task", "task", r.ID, "lease", r.LeaseID, "err", err)
		}
		return r, false
	}
	p.log.Warn("lease lost: its task stopped", "task", r.ID, "lease", r.LeaseID, "reason", reason)
	r.State = TaskStopping
	r.AgentURL = "" // dead: no fence
	return r, true
}

// checkHealth checks the agents of ready tasks that are due, at most
// HealthCheckInterval apart each, and returns those that failed
// HealthFailures checks in a row (now stopping). cycle is the walk that
// saw them (bookkeeping of tasks a whole walk did not see as ready goes).
func (m *Manager) checkHealth(ctx context.Context, p *pool, alive []TaskRecord, cycle int) []TaskRecord {
	now := time.Now()
	var due []TaskRecord
	p.mu.Lock()
	for _, t := range alive {
		if t.State != TaskReady {
			continue
		}
		h := p.health[t.ID]
		if h == nil { // checked when it became ready
			p.health[t.ID] = &healthState{next: now.Add(m.cfg.HealthCheckInterval), cycle: cycle}
			continue
		}
		h.cycle = cycle
		if !now.Before(h.next) {
			h.next = now.Add(m.cfg.HealthCheckInterval)
			due = append(due, t)
		}
	}
	p.mu.Unlock()

	var mu sync.Mutex
	var failed []TaskRecord
	var g errgroup.Group
	g.SetLimit(healthConcurrency)
	for _, t := range due {
		g.Go(func() error {
			hctx, cancel := context.WithTimeout(ctx, m.cfg.HealthTimeout)
			h, err := m.agents.Health(hctx, t.AgentURL, t.AgentToken)
			cancel()
			if err == nil {
				err = compatibleAgent(h)
			}
			p.mu.Lock()
			st := p.health[t.ID]
			n := 0
			if st != nil {
				if err == nil {
					st.failures = 0
				} else {
					st.failures++
				}
				n = st.failures
			}
			p.mu.Unlock()
			if err == nil || n < m.cfg.HealthFailures || ctx.Err() != nil {
				return nil
			}
			p.log.Warn("a ready task's agent is unhealthy; replacing it", "task", t.ID, "failures", n, "err", err)
			if r, ok := m.transition(ctx, p, t, TaskStopping, "its agent failed "+fmt.Sprint(n)+" health checks: "+err.Error()); ok {
				mu.Lock()
				failed = append(failed, r)
				mu.Unlock()
			}
			return nil
		})
	}
	_ = g.Wait() // the functions return nil
	return failed
}

// stopAll stops and deletes stopping tasks, a few at a time.
func (m *Manager) stopAll(ctx context.Context, recs []TaskRecord) {
	var g errgroup.Group
	g.SetLimit(stopConcurrency)
	for _, r := range recs {
		g.Go(func() error {
			reason := r.Reason
			if reason == "" {
				reason = "stopping"
			}
			err := m.stopTask(ctx, r, reason)
			switch {
			case errors.Is(err, errNoProvider):
				m.unstoppable(r, err)
			case err != nil && ctx.Err() == nil:
				m.log.Warn("stop task: will retry", "pool", r.Pool, "task", r.ID, "err", err)
			}
			return nil
		})
	}
	_ = g.Wait() // the functions return nil
}
