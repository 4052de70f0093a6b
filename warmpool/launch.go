package warmpool

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/quarryhq/quarry/providers"
)

// Reasons a refill could not proceed: the "reason" label of
// quarry_refill_blocked_total, and the log line that names the limit.
const (
	blockedMaxTotal = "max_total"   // demand, but the pool is at max_total
	blockedStore    = "store"       // the store refused or failed the reservation
	blockedBackoff  = "backoff"     // launches failed: paused (QUARRY_LAUNCH_BACKOFF)
	blockedInFlight = "concurrency" // QUARRY_LAUNCH_CONCURRENCY Launch calls in flight
)

// refill reserves and launches tasks for the pool's demand, from its
// counts (c): on the lock holder (holder) ready + launching up to min_warm
// plus this replica's waiting acquires; on another replica only its
// waiting acquires, less what it is starting already. At most
// Config.LaunchBudget tasks, in chunks of Config.LaunchChunk (within the
// store's ReserveLimiter), with at most Config.LaunchConcurrency Launch
// calls of the pool in flight. ReserveTasks decides atomically, so
// max_total holds however many replicas refill; a refill that cannot
// proceed counts quarry_refill_blocked_total and logs once per streak.
func (m *Manager) refill(ctx context.Context, p *pool, c TaskCounts, holder bool) {
	if p.od == nil {
		m.metrics.setTaskCounts(p.cfg.Name, c)
	}
	waiting := p.queue.len()
	want := waiting - c.Ready - p.localTasks()
	if holder || p.warmHere() {
		// An on-demand pool's warm target may come from a prefetch on this
		// replica: the counts are the store's, so replicas converge.
		want = p.minWarm() + waiting - c.Ready - c.Launching
	}
	room := p.cfg.MaxTotal - c.Total()
	n := min(want, room, m.cfg.LaunchBudget)
	switch {
	case want <= 0:
		p.blocked(m, "", 0)
		return
	case room <= 0:
		if waiting > 0 {
			p.blocked(m, blockedMaxTotal, want)
		}
		return
	case !p.launchAllowed():
		p.blocked(m, blockedBackoff, want)
		return
	}
	chunk := m.cfg.LaunchChunk
	if l, ok := m.store.(ReserveLimiter); ok {
		chunk = min(chunk, l.MaxReserve())
	}
	for n > 0 {
		if !p.startLaunch() {
			p.blocked(m, blockedInFlight, n)
			return
		}
		k := min(chunk, n)
		recs := make([]TaskRecord, k)
		for i := range recs {
			recs[i] = m.newTaskRecord(p)
		}
		sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
		err := m.reserve(sctx, p, recs)
		cancel()
		if err != nil && lostAnswer(err) && ctx.Err() == nil {
			// The reservation may have been written all the same: adoptLost
			// finds out, holding the Launch call meanwhile, and launches it
			// if so.
			if m.goBackground(CallerReconcile, func(bg context.Context) { m.adoptLost(bg, p, recs) }) {
				p.blocked(m, blockedStore, n, "err", err)
				return
			}
		}
		if err != nil {
			p.endLaunch(0)
			switch {
			case errors.Is(err, ErrNoCapacity):
				if waiting > 0 {
					p.blocked(m, blockedMaxTotal, n)
				}
			case ctx.Err() == nil:
				p.blocked(m, blockedStore, n, "err", err)
				p.launchResult(false, m.cfg.LaunchBackoff, m.cfg.LaunchBackoffMax)
			}
			return
		}
		p.blocked(m, "", 0)
		for i := range recs {
			recs[i].Version = 1
		}
		p.addLocal(k)
		if !m.goBackground(CallerReconcile, func(bg context.Context) { m.launchChunk(bg, p, recs) }) {
			p.endLaunch(k)
			for _, r := range recs { // closed meanwhile: nothing was launched
				_ = m.store.DeleteTask(context.WithoutCancel(ctx), r)
			}
			return
		}
		n -= k
	}
}

// lostAnswer reports whether a reservation's error leaves open whether it
// was written: not a refusal the store decided (no capacity, an id taken,
// the store closed), but a deadline, a broken connection or a store error
// whose request may have been applied before it failed.
func lostAnswer(err error) bool {
	return !errors.Is(err, ErrNoCapacity) && !errors.Is(err, ErrConflict) && !errors.Is(err, ErrClosed)
}

// lostAnswerWait is adoptLost's first wait (1 s; its longest is 8 times
// it). Tests shorten it (export_test.go).
var lostAnswerWait atomic.Int64

func init() { lostAnswerWait.Store(int64(time.Second)) }

// adoptLost settles a reservation whose answer was lost (refill holds its
// Launch call for it): ReserveTasks writes all or none, so its first
// record tells. Looked for after 1, 2, 4 and 8 s (a request the store
// received may be applied after its caller gave up), then every 8 s while
// the store does not answer, until the records' launch deadline (after
// which the reconciler gives them up); found, the tasks are launched as
// if the answer had come, instead of holding their slots until that
// deadline; not found after 8 s, the refill backs off as after any failed
// reservation.
func (m *Manager) adoptLost(ctx context.Context, p *pool, recs []TaskRecord) {
	first := time.Duration(lostAnswerWait.Load())
	for wait := first; ; wait = min(2*wait, 8*first) {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			p.endLaunch(0)
			return
		case <-t.C:
		}
		sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
		rec, err := m.store.GetTask(sctx, recs[0].ID)
		cancel()
		if err == nil && rec.State == TaskLaunching && rec.Version == 1 {
			m.log.Info("a reservation whose answer was lost was written: launching it", "pool", p.cfg.Name, "tasks", len(recs))
			for i := range recs {
				recs[i].Version = 1
			}
			p.addLocal(len(recs))
			m.launchChunk(ctx, p, recs)
			return
		}
		if err == nil {
			break // written, and taken over since (the orphan sweep): not ours to launch
		}
		if errors.Is(err, ErrNotFound) && wait >= 8*first {
			break // not written
		}
		if !m.clock.Now().Before(recs[0].LaunchDeadline) {
			break // the store never answered: the reconciler gives them up
		}
	}
	p.endLaunch(0)
	p.launchResult(false, m.cfg.LaunchBackoff, m.cfg.LaunchBackoffMax)
	p.poke()
}

// launchChunk launches reserved tasks (one Launch call) and hands the ones
// that started to the pool's starter, which makes them ready; the ones that
// did not become stopping, and their failure is offered to waiting
// acquires.
func (m *Manager) launchChunk(ctx context.Context, p *pool, recs []TaskRecord) {
	lctx, cancel := context.WithTimeout(ctx, m.cfg.LaunchQueueTimeout+p.startupTimeout())
	launched, err := m.launch(lctx, p, recs)
	cancel()
	p.endLaunch(len(recs) - len(launched))
	if failed := len(recs) - len(launched); failed > 0 {
		if err == nil {
			err = errors.New("the provider did not start them")
		}
		if errors.Is(err, providers.ErrInvalidSpec) {
			failed = p.queue.len() // no launch of the pool can succeed
		}
		p.queue.fail(err, failed)
	}
	if len(launched) == 0 {
		p.launchResult(false, m.cfg.LaunchBackoff, m.cfg.LaunchBackoffMax)
		p.poke()
		return
	}
	m.startAll(p, launched, &chunkResult{pending: len(launched), ok: err == nil})
	p.poke() // a Launch call is free: the pool may launch more
}

// startTask launches one reserved task and waits until its agent is
// healthy: the cold start of an acquire on a manager whose background work
// does not run (Lambda, or after Close). On failure the task is given up
// (stopping).
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
// ids, agent addresses and startup deadlines: each task's deadline starts
// when the provider created it (its RunTask), not when it was reserved, so
// time queued behind the provider's rate limits does not count. Tasks that
// did not launch are given up. It returns the launched records (still
// launching) and the launch error, if any.
func (m *Manager) launch(ctx context.Context, p *pool, recs []TaskRecord) ([]TaskRecord, error) {
	names := make([]string, len(recs))
	for i, r := range recs {
		names[i] = r.ID
	}
	tasks, launchErr := m.prepareAndLaunch(ctx, p, p.specOf(recs[0]), names)
	if launchErr != nil {
		launchErr = fmt.Errorf("launch %d task(s): %w", len(names), launchErr)
	}
	byName := make(map[string]providers.Task, len(tasks))
	for _, t := range tasks {
		byName[t.Name] = t
	}
	now := m.clock.Now()
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
		m.metrics.launches.WithLabelValues(p.metric).Inc()
		rec.ProviderID, rec.AgentURL, rec.AgentToken = t.ID, t.AgentURL, t.AgentToken
		rec.UpdatedAt = now
		rec.LaunchDeadline = launchedAt(t, rec, now).Add(p.startupTimeout())
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StoreTimeout)
		r, err := m.store.UpdateTask(sctx, rec, rec.State)
		cancel()
		if err != nil {
			// Applied, its answer lost: the record holds the task (a
			// launch given up here would stop it and leave its record
			// launching, its slot held until its launch deadline).
			got, ok := m.readBack(ctx, rec.ID, func(got TaskRecord) bool {
				return got.State == TaskLaunching && got.ProviderID == rec.ProviderID
			})
			if !ok {
				m.failLaunch(ctx, p, rec, fmt.Errorf("record the launched task: %w", err))
				continue
			}
			p.log.Info("recording a launched task failed, and it is recorded: kept", "task", rec.ID, "err", err)
			r = got
		}
		out = append(out, r)
	}
	for _, t := range byName { // tasks under names nobody asked for
		m.stopProviderTask(ctx, p, p.provider, t.ID, "launched under an unexpected name")
	}
	if len(out) == 0 && launchErr == nil && len(recs) > 0 {
		launchErr = fmt.Errorf("launch %d task(s): none could be recorded", len(recs))
	}
	return out, launchErr
}

// launchedAt is when the provider launched t: its creation time when the
// provider reports one (never before its reservation nor after now), else
// now.
func launchedAt(t providers.Task, rec TaskRecord, now time.Time) time.Time {
	at := t.CreatedAt
	if at.IsZero() || at.After(now) {
		return now
	}
	if at.Before(rec.CreatedAt) {
		return rec.CreatedAt
	}
	return at
}

// newTaskRecord returns the record of a task about to be reserved. Its
// first deadline allows for the wait in front of the provider
// (LaunchQueueTimeout) as well as the start; launch moves it to the
// provider's launch plus the startup timeout.
func (m *Manager) newTaskRecord(p *pool) TaskRecord {
	now := m.clock.Now()
	var class string
	if p.od != nil {
		class = p.od.class.cfg.Name
	}
	return TaskRecord{
		ID: NewTaskID(), Pool: p.cfg.Name, Provider: p.cfg.Provider, Spec: p.digest, Class: class, State: TaskLaunching,
		CreatedAt: now, UpdatedAt: now, LaunchDeadline: now.Add(m.cfg.LaunchQueueTimeout + p.startupTimeout()),
	}
}

// markReady makes a launched (or given back) task claimable, offers it to
// the pool's first waiting acquire and wakes the others.
func (m *Manager) markReady(ctx context.Context, p *pool, rec TaskRecord) (TaskRecord, error) {
	from := rec.State
	rec.State = TaskReady
	rec.Reason = ""
	rec.UpdatedAt = m.clock.Now()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StoreTimeout)
	defer cancel()
	out, err := m.store.UpdateTask(sctx, rec, from)
	if err != nil {
		// The write may have been applied and its answer lost, and the
		// task claimed since: a task that is ready or leased on the agent
		// it was launched with is alive in the pool's hands, not a failure
		// to give up (which would stop a sandbox someone holds).
		got, ok := m.readBack(ctx, rec.ID, func(got TaskRecord) bool {
			return (got.State == TaskReady || got.State == TaskLeased) && got.AgentURL == rec.AgentURL
		})
		if !ok {
			return rec, fmt.Errorf("mark task %s ready: %w", rec.ID, err)
		}
		p.log.Info("marking a task ready failed, and it is ready or leased already: kept", "task", rec.ID, "state", got.State, "err", err)
		out = got
	}
	if out.State == TaskReady {
		p.queue.offer(out.ID)
	}
	p.changed.broadcast()
	return out, nil
}

// readBack reads task id after a write of it failed, which may have been
// applied with its answer lost (a deadline, a broken connection; a retry
// of it then conflicts with its own result): it returns the record and
// whether applied says the write is in it. A failed read is false.
func (m *Manager) readBack(ctx context.Context, id string, applied func(TaskRecord) bool) (TaskRecord, bool) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StoreTimeout)
	defer cancel()
	got, err := m.store.GetTask(rctx, id)
	return got, err == nil && applied(got)
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
	m.metrics.launchFailures.WithLabelValues(p.metric).Inc()
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
	if r, ok := m.transition(ctx, p, rec, TaskStopping, reason); ok {
		if r.ProviderID == "" {
			// The provider returned no task for it: free the slot (the
			// orphan sweep stops a task it may have started under its name).
			sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
			err := m.store.DeleteTask(sctx, r)
			cancel()
			if err == nil {
				m.freed(p, r.ID)
				return
			}
		} else if err := m.stopTask(ctx, r, reason); err == nil {
			return
		}
		p.poke() // the walk finishes the job
		return
	}
	if rec.ProviderID != "" {
		m.stopProviderTask(ctx, p, p.provider, rec.ProviderID, reason)
	}
}

// stopProviderTask stops a task of prov directly (no record to update).
func (m *Manager) stopProviderTask(ctx context.Context, p *pool, prov providers.Provider, id, reason string) {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.ProviderTimeout)
	defer cancel()
	if err := prov.Stop(pctx, id, reason); err != nil {
		p.log.Warn("stop provider task: the orphan sweep will retry", "provider_task", id, "err", err)
	}
}
