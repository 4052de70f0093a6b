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
	// readyPollMax is the longest pause between health checks of a
	// starting agent (they start at 10 ms and double).
	readyPollMax = 500 * time.Millisecond
	// refillGap is the shortest time between two refills that wake-ups
	// (not the ticker) start in one pool: a busy pool's acquires wake the
	// reconciler on every call, and each refill reads the pool's tasks (on
	// DynamoDB a query per shard), so a busy pool is refilled at most once
	// a second besides its passes. (A launch takes longer than that.)
	refillGap = time.Second
)

// reconcileLoop reconciles p now and every ReconcileInterval until ctx
// ends, on the replica that holds the pool's lock (the others only try to
// take it on each tick, so one replica takes over when the holder dies and
// its lock expires). Being woken (after an acquire, or when a task became
// ready) only refills, at most every refillGap, and only on the holder:
// the full pass describes every task, which is too much work to repeat on
// every acquire of a busy pool.
func (m *Manager) reconcileLoop(ctx context.Context, p *pool) {
	lock := lockPoolPrefix + p.cfg.Name
	pass := m.locked(lock, m.cfg.ReconcileInterval, func(ctx context.Context) { m.reconcile(ctx, p) })
	t := time.NewTicker(m.cfg.ReconcileInterval)
	defer t.Stop()
	pass(ctx)
	lastRefill := time.Now()
	var putOff <-chan time.Time // a wake-up's refill, put off until refillGap has passed
	refill := func() {
		putOff, lastRefill = nil, time.Now()
		if m.holdLock(ctx, lock, m.cfg.ReconcileInterval) {
			m.refill(ctx, p, nil)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			pass(ctx) // it refills too
			putOff, lastRefill = nil, time.Now()
		case <-p.wake:
			switch wait := time.Until(lastRefill.Add(refillGap)); {
			case !m.holds(lock) || putOff != nil:
				// The holder refills on its next pass (acquires here
				// cold-start meanwhile), or a refill is due already.
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

// reconcile is one pass over a pool: finish stopping tasks, give up
// launches past their deadline, notice tasks that died (a ready one is
// replaced, a leased one's lease ends as lost), health-check ready tasks,
// and launch until ready + launching >= min_warm within max_total. Every
// decision is a conditional store write, so a pass racing another replica's
// loses cleanly. Errors are logged; the next pass tries again.
func (m *Manager) reconcile(ctx context.Context, p *pool) {
	tasks, err := m.listTasks(ctx, p.cfg.Name)
	if err != nil {
		if ctx.Err() == nil {
			p.log.Warn("reconcile: read tasks", "err", err)
		}
		return
	}
	now := m.clock.Now()
	var stop, running []TaskRecord
	for _, t := range tasks {
		switch t.State {
		case TaskStopping:
			stop = append(stop, t)
		case TaskLaunching:
			if !t.LaunchDeadline.IsZero() && now.After(t.LaunchDeadline) {
				if r, ok := m.transition(ctx, p, t, TaskStopping, "it did not become ready before its launch deadline"); ok {
					p.log.Warn("launch deadline passed; stopping the task", "task", t.ID)
					m.metrics.launchFailures.WithLabelValues(p.cfg.Name).Inc()
					stop = append(stop, r)
				}
			}
		case TaskReady, TaskLeased:
			if t.ProviderID != "" {
				running = append(running, t)
			}
		}
	}
	dead, alive := m.checkRunning(ctx, p, running)
	stop = append(stop, dead...)
	stop = append(stop, m.checkHealth(ctx, p, alive)...)
	m.stopAll(ctx, stop)
	if len(stop) > 0 {
		tasks = nil // slots were freed: count afresh
	}
	m.refill(ctx, p, tasks)
}

// listTasks reads a pool's tasks with the store timeout.
func (m *Manager) listTasks(ctx context.Context, pool string) ([]TaskRecord, error) {
	sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
	defer cancel()
	return m.store.ListTasks(sctx, pool)
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
		prov, ok := m.providers[name]
		if !ok {
			p.log.Warn("tasks of an unconfigured provider are left alone", "provider", name, "tasks", len(recs))
			continue
		}
		for start := 0; start < len(recs); start += describeBatch {
			batch := recs[start:min(start+describeBatch, len(recs))]
			ids := make([]string, len(batch))
			for i, r := range batch {
				ids[i] = r.ProviderID
			}
			pctx, cancel := context.WithTimeout(ctx, m.cfg.ProviderTimeout)
			described, err := prov.Describe(pctx, ids)
			cancel()
			if err != nil {
				p.log.Warn("describe tasks", "err", err)
				alive = append(alive, batch...)
				continue
			}
			byID := make(map[string]providers.Task, len(described))
			for _, t := range described {
				byID[t.ID] = t
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
// HealthFailures checks in a row (now stopping).
func (m *Manager) checkHealth(ctx context.Context, p *pool, alive []TaskRecord) []TaskRecord {
	now := time.Now()
	var due []TaskRecord
	p.mu.Lock()
	ready := map[string]bool{}
	for _, t := range alive {
		if t.State != TaskReady {
			continue
		}
		ready[t.ID] = true
		h := p.health[t.ID]
		if h == nil { // checked when it became ready
			p.health[t.ID] = &healthState{next: now.Add(m.cfg.HealthCheckInterval)}
			continue
		}
		if !now.Before(h.next) {
			h.next = now.Add(m.cfg.HealthCheckInterval)
			due = append(due, t)
		}
	}
	for id := range p.health {
		if !ready[id] {
			delete(p.health, id)
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
			if err := m.stopTask(ctx, r, reason); err != nil && ctx.Err() == nil {
				m.log.Warn("stop task: will retry", "pool", r.Pool, "task", r.ID, "err", err)
			}
			return nil
		})
	}
	_ = g.Wait() // the functions return nil
}

// refill reserves and launches tasks until ready + launching >= min_warm,
// counting tasks (the pool's records as just read by the caller, or read
// here when nil). ReserveTasks decides atomically, so max_total holds
// however many reconcilers race, and a stale count only delays a launch to
// the next pass; the launches run in the background.
func (m *Manager) refill(ctx context.Context, p *pool, tasks []TaskRecord) {
	if tasks == nil {
		var err error
		if tasks, err = m.listTasks(ctx, p.cfg.Name); err != nil {
			if ctx.Err() == nil {
				p.log.Warn("refill: read tasks", "err", err)
			}
			return
		}
	}
	c := CountStates(tasks)
	m.metrics.setTaskCounts(p.cfg.Name, c)
	n := min(p.cfg.MinWarm-c.Ready-c.Launching, p.cfg.MaxTotal-len(tasks))
	if n <= 0 || !p.launchAllowed() {
		return
	}
	recs := make([]TaskRecord, n)
	for i := range recs {
		recs[i] = m.newTaskRecord(p)
	}
	sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
	err := m.store.ReserveTasks(sctx, p.cfg.Name, p.cfg.MaxTotal, recs)
	cancel()
	if err != nil {
		if !errors.Is(err, ErrNoCapacity) && ctx.Err() == nil {
			p.log.Warn("refill: reserve tasks", "err", err)
		}
		return
	}
	for i := range recs {
		recs[i].Version = 1
	}
	if !m.goBackground(CallerReconcile, func(bg context.Context) { m.launchBatch(bg, p, recs) }) {
		for _, r := range recs { // closed meanwhile: nothing was launched
			_ = m.store.DeleteTask(context.WithoutCancel(ctx), r)
		}
	}
}

// launchBatch launches reserved tasks for the pool, waits for their agents
// and marks them ready; the ones that fail become stopping.
func (m *Manager) launchBatch(ctx context.Context, p *pool, recs []TaskRecord) {
	lctx, cancel := context.WithTimeout(ctx, p.startupTimeout())
	defer cancel()
	launched, err := m.launch(lctx, p, recs)
	ok := err == nil && len(launched) == len(recs)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, rec := range launched {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := m.waitReady(lctx, p, rec)
			if err == nil {
				if _, err = m.markReady(ctx, p, r); err == nil {
					return
				}
			}
			m.failLaunch(ctx, p, r, err)
			mu.Lock()
			ok = false
			mu.Unlock()
		}()
	}
	wg.Wait()
	p.launchResult(ok, m.cfg.LaunchBackoff, m.cfg.LaunchBackoffMax)
}

// startTask launches one reserved task and waits until its agent is
// healthy (a cold start). On failure the task is given up (stopping).
func (m *Manager) startTask(ctx context.Context, p *pool, rec TaskRecord) (TaskRecord, error) {
	launched, err := m.launch(ctx, p, []TaskRecord{rec})
	if len(launched) == 0 {
		return rec, err
	}
	r, err := m.waitReady(ctx, p, launched[0])
	if err != nil {
		m.failLaunch(ctx, p, r, err)
		return r, fmt.Errorf("start task %s: %w", rec.ID, err)
	}
	return r, nil
}

// launch asks the provider for the tasks of recs and records their provider
// ids and agent addresses. Tasks that did not launch are given up. It
// returns the launched records (still launching) and the launch error, if
// any.
func (m *Manager) launch(ctx context.Context, p *pool, recs []TaskRecord) ([]TaskRecord, error) {
	names := make([]string, len(recs))
	for i, r := range recs {
		names[i] = r.ID
	}
	tasks, launchErr := p.provider.Launch(ctx, p.spec, names)
	if launchErr != nil {
		launchErr = fmt.Errorf("launch %d task(s): %w", len(names), launchErr)
	}
	byName := make(map[string]providers.Task, len(tasks))
	for _, t := range tasks {
		byName[t.Name] = t
	}
	var out []TaskRecord
	for _, rec := range recs {
		t, ok := byName[rec.ID]
		if !ok {
			err := launchErr
			if err == nil {
				err = errors.New("the provider did not start it")
			}
			m.failLaunch(ctx, p, rec, err)
			continue
		}
		delete(byName, rec.ID)
		m.metrics.launches.WithLabelValues(p.cfg.Name).Inc()
		rec.ProviderID, rec.AgentURL, rec.AgentToken = t.ID, t.AgentURL, t.AgentToken
		rec.UpdatedAt = m.clock.Now()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StoreTimeout)
		r, err := m.store.UpdateTask(sctx, rec, rec.State)
		cancel()
		if err != nil {
			m.failLaunch(ctx, p, rec, fmt.Errorf("record the launched task: %w", err))
			continue
		}
		out = append(out, r)
	}
	for _, t := range byName { // tasks under names nobody asked for
		m.stopProviderTask(ctx, p, t.ID, "launched under an unexpected name")
	}
	if len(out) == 0 && launchErr == nil && len(recs) > 0 {
		launchErr = fmt.Errorf("launch %d task(s): none could be recorded", len(recs))
	}
	return out, launchErr
}

// waitReady polls the agent of a launched task until /healthz passes, the
// task stops, its launch deadline passes or ctx ends. At most once a
// second, while the task has no agent address yet (the provider assigns it
// late) or its agent does not answer, it describes the task to learn the
// address or whether the task stopped.
func (m *Manager) waitReady(ctx context.Context, p *pool, rec TaskRecord) (TaskRecord, error) {
	delay := 10 * time.Millisecond
	var lastErr error
	var lastDescribe time.Time
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for {
		if (rec.AgentURL == "" || lastErr != nil) && time.Since(lastDescribe) >= time.Second {
			lastDescribe = time.Now()
			t, err := m.describeOne(ctx, p, rec.ProviderID)
			switch {
			case err != nil:
				lastErr = err
			case t.State == providers.TaskStopped:
				return rec, fmt.Errorf("the task stopped while starting: %s", stoppedReason(t))
			case rec.AgentURL == "" && t.AgentURL != "":
				rec.AgentURL, rec.AgentToken = t.AgentURL, t.AgentToken
				sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
				r, err := m.store.UpdateTask(sctx, rec, rec.State)
				cancel()
				if err != nil {
					return rec, fmt.Errorf("record the agent address: %w", err)
				}
				rec = r
			}
		}
		if rec.AgentURL != "" {
			hctx, cancel := context.WithTimeout(ctx, m.cfg.HealthTimeout)
			h, err := m.agents.Health(hctx, rec.AgentURL, rec.AgentToken)
			cancel()
			if err == nil {
				if err = compatibleAgent(h); err == nil {
					return rec, nil
				}
				if errors.Is(err, errIncompatible) {
					return rec, err
				}
			}
			lastErr = err
		}
		if !rec.LaunchDeadline.IsZero() && m.clock.Now().After(rec.LaunchDeadline) {
			return rec, fmt.Errorf("the agent was not healthy before the launch deadline: %w", lastErr)
		}
		timer.Reset(delay)
		select {
		case <-ctx.Done():
			return rec, fmt.Errorf("the agent was not healthy in time (%w): last check: %w", ctx.Err(), lastErr)
		case <-timer.C:
		}
		delay = min(2*delay, readyPollMax)
	}
}

// describeOne describes one provider task.
func (m *Manager) describeOne(ctx context.Context, p *pool, id string) (providers.Task, error) {
	pctx, cancel := context.WithTimeout(ctx, m.cfg.ProviderTimeout)
	defer cancel()
	tasks, err := p.provider.Describe(pctx, []string{id})
	if err != nil {
		return providers.Task{}, fmt.Errorf("describe task %s: %w", id, err)
	}
	for _, t := range tasks {
		if t.ID == id {
			return t, nil
		}
	}
	return providers.Task{}, fmt.Errorf("describe task %s: not in the answer", id)
}

// markReady makes a launched (or given back) task claimable and wakes
// waiting acquires.
func (m *Manager) markReady(ctx context.Context, p *pool, rec TaskRecord) (TaskRecord, error) {
	from := rec.State
	rec.State = TaskReady
	rec.Reason = ""
	rec.UpdatedAt = m.clock.Now()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StoreTimeout)
	defer cancel()
	out, err := m.store.UpdateTask(sctx, rec, from)
	if err != nil {
		return rec, fmt.Errorf("mark task %s ready: %w", rec.ID, err)
	}
	p.changed.broadcast()
	return out, nil
}

// giveBack returns a healthy task that its cold start could not use to the
// pool as ready; if that fails it is given up.
func (m *Manager) giveBack(ctx context.Context, p *pool, rec TaskRecord) {
	if _, err := m.markReady(ctx, p, rec); err != nil {
		m.markStopping(ctx, p, rec, "it could not be returned to the pool")
	}
}

// failLaunch counts a failed launch and gives the task up.
func (m *Manager) failLaunch(ctx context.Context, p *pool, rec TaskRecord, err error) {
	m.metrics.launchFailures.WithLabelValues(p.cfg.Name).Inc()
	if ctx.Err() == nil {
		p.log.Warn("launch failed", "task", rec.ID, "err", err)
	}
	reason := "launch failed"
	if err != nil {
		reason += ": " + err.Error()
	}
	m.markStopping(ctx, p, rec, reason)
}

// markStopping gives a launching task up: the reconciler stops and deletes
// it. If the record moved on or is gone (the reconciler gave it up first),
// the provider task is stopped here, as nothing else will.
func (m *Manager) markStopping(ctx context.Context, p *pool, rec TaskRecord, reason string) {
	ctx = context.WithoutCancel(ctx)
	if _, ok := m.transition(ctx, p, rec, TaskStopping, reason); ok {
		p.poke()
		return
	}
	if rec.ProviderID != "" {
		m.stopProviderTask(ctx, p, rec.ProviderID, reason)
	}
}

// stopProviderTask stops a provider task directly (no record to update).
func (m *Manager) stopProviderTask(ctx context.Context, p *pool, id, reason string) {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.ProviderTimeout)
	defer cancel()
	if err := p.provider.Stop(pctx, id, reason); err != nil {
		p.log.Warn("stop provider task: the orphan sweep will retry", "provider_task", id, "err", err)
	}
}
