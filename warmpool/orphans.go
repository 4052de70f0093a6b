package warmpool

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/quarryhq/quarry/providers"
)

// orphanSweep is where the orphan sweep's cycle is. Only the sweep's
// goroutine (or RunOnce) uses it.
type orphanSweep struct {
	active bool
	// listed are the provider tasks of this gateway, by provider, as listed
	// when the cycle started.
	listed map[string][]providers.Task
	// known holds the task ids and provider ids the records walked so far
	// account for.
	known  map[string]bool
	cursor string
	// seen is when the sweep first saw a provider task that reports no
	// creation time (kept across cycles).
	seen map[string]time.Time
	// stopped are the orphans the sweep stopped that the provider still
	// lists, stopped (ECS reports a stopped task for about an hour): they
	// are not stopped again (kept across cycles, while listed).
	stopped map[string]bool
}

// sweepOrphans runs one pass of the orphan sweep, bounded by
// Config.OrphanBudget records whatever the number of tasks. A cycle lists
// each provider that pools use once (the tasks carrying this gateway's
// labels), then walks the records of every pool a budget per pass
// (ListTasksPage) collecting what they account for, and winds down the
// records of pools that are no longer configured on the way (their idle
// tasks are stopped; leased ones are left to their lease). When the walk
// ends, a listed task that no record accounted for and that is older than
// OrphanGrace is read once more by name (GetTask, consistent) and stopped
// (with OrphanDryRun only logged).
func (m *Manager) sweepOrphans(ctx context.Context) {
	o := &m.orphans
	if !o.active {
		m.startOrphanCycle(ctx)
	}
	now := m.clock.Now()
	var winddown []TaskRecord
	for budget := m.cfg.OrphanBudget; budget > 0 && ctx.Err() == nil; {
		sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
		page, err := m.store.ListTasksPage(sctx, "", o.cursor, min(budget, pageMax))
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				m.log.Warn("orphan sweep: read tasks", "err", err)
			}
			return // the next pass goes on from the same place
		}
		m.metrics.orphanWalked.Add(float64(len(page.Tasks)))
		for _, r := range page.Tasks {
			o.known[r.ID] = true
			if r.ProviderID != "" {
				o.known[r.ProviderID] = true
			}
			if m.pools[r.Pool] == nil && (r.Class == "" || m.classes[r.Class] == nil) {
				winddown = append(winddown, r) // an on-demand pool's task is its class loop's
			}
		}
		budget -= max(len(page.Tasks), 1)
		if o.cursor = page.Next; o.cursor == "" {
			break
		}
	}
	m.windDownUnconfigured(ctx, winddown, now)
	if o.cursor == "" && ctx.Err() == nil {
		m.endOrphanCycle(ctx, now)
	}
}

// startOrphanCycle lists the providers for the new cycle. Records are
// walked after the listing: a record is written before its task is
// launched, so every listed task's record exists by the time the walk
// reads it.
func (m *Manager) startOrphanCycle(ctx context.Context) {
	o := &m.orphans
	o.listed = map[string][]providers.Task{}
	for _, name := range m.providersInUse() {
		pctx, cancel := context.WithTimeout(ctx, m.cfg.ProviderTimeout)
		tasks, err := m.providers[name].List(pctx, "")
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				m.log.Warn("orphan sweep: list provider tasks", "provider", name, "err", err)
			}
			continue
		}
		var ours []providers.Task
		for _, t := range tasks {
			if m.ours(t) {
				ours = append(ours, t)
			}
		}
		o.listed[name] = ours
	}
	o.active, o.cursor, o.known = true, "", map[string]bool{}
}

// endOrphanCycle stops the listed tasks no walked record accounted for.
func (m *Manager) endOrphanCycle(ctx context.Context, now time.Time) {
	o := &m.orphans
	o.active = false
	listedIDs := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(o.listed)) {
		for _, t := range o.listed[name] {
			listedIDs[t.ID] = true
			if t.State == providers.TaskStopped && o.stopped[t.ID] {
				continue // stopped by an earlier cycle: nothing is left of it to stop
			}
			if !m.isOrphan(ctx, t, now) {
				continue
			}
			log := m.log.With("provider", name, "provider_task", t.ID, "name", t.Name, "pool", t.Pool)
			if m.cfg.OrphanDryRun {
				log.Info("orphan task (dry run: left running)")
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, m.cfg.ProviderTimeout)
			err := m.providers[name].Stop(pctx, t.ID, "orphan: no Quarry task record accounts for it")
			cancel()
			if err != nil {
				log.Warn("stop orphan task", "err", err)
				continue
			}
			m.metrics.orphans.WithLabelValues(name).Inc()
			log.Warn("stopped an orphan task")
			o.stopped[t.ID] = true
		}
	}
	for id := range o.seen { // forget tasks the providers no longer list
		if !listedIDs[id] {
			delete(o.seen, id)
		}
	}
	for id := range o.stopped {
		if !listedIDs[id] {
			delete(o.stopped, id)
		}
	}
	o.listed, o.known = nil, nil
}

// ours reports whether a provider task is this gateway's: managed, and
// not labelled with another gateway fleet's id. A stopped task is one
// too: its remains (an exited container, a task directory) are what Stop
// removes.
func (m *Manager) ours(t providers.Task) bool {
	if v, ok := t.Labels[providers.LabelManaged]; ok && v != "true" {
		return false
	}
	gw := t.Labels[providers.LabelGateway]
	return gw == "" || gw == m.cfg.GatewayID
}

// isOrphan reports whether a listed task of this gateway is older than the
// grace period and unknown to the store: no walked record accounted for
// it, and (when it has a name) its record is not there when read again.
func (m *Manager) isOrphan(ctx context.Context, t providers.Task, now time.Time) bool {
	o := &m.orphans
	name := t.Name
	if name == "" {
		name = t.Labels[providers.LabelTask]
	}
	if o.known[t.ID] || o.known[t.Name] || o.known[t.Labels[providers.LabelTask]] {
		return false
	}
	created := t.CreatedAt
	if created.IsZero() { // age unknown: count from when this sweep first saw it
		if created = o.seen[t.ID]; created.IsZero() {
			created = now
			o.seen[t.ID] = now
		}
	}
	if now.Sub(created) < m.cfg.OrphanGrace {
		return false
	}
	if name == "" {
		return true
	}
	sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
	_, err := m.store.GetTask(sctx, name)
	cancel()
	return errors.Is(err, ErrNotFound) // an error of the store keeps it for the next cycle
}

// windDownUnconfigured stops the idle tasks of pools that are no longer
// configured (no reconciler looks after them).
func (m *Manager) windDownUnconfigured(ctx context.Context, recs []TaskRecord, now time.Time) {
	var stop []TaskRecord
	for _, r := range recs {
		switch {
		case r.State == TaskStopping:
			stop = append(stop, r)
		case r.State == TaskReady || r.State == TaskLaunching && now.After(r.LaunchDeadline):
			from := r.State
			r.State, r.Reason, r.UpdatedAt = TaskStopping, "its pool is no longer configured", now
			sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
			out, err := m.store.UpdateTask(sctx, r, from)
			cancel()
			if err == nil {
				stop = append(stop, out)
			}
		}
	}
	if len(stop) > 0 {
		m.log.Info("stopping tasks of pools that are no longer configured", "tasks", len(stop))
		m.stopAll(ctx, stop)
	}
}
