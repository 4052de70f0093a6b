package warmpool

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/quarryhq/quarry/providers"
)

const (
	// reapBatch bounds how many expired leases one reaper pass ends.
	reapBatch = 500
	// purgeInterval is how often the reaper purges ended leases past their
	// retention (hours): every pass would read the store for nothing.
	purgeInterval = time.Minute
)

// reap ends active leases whose expiry passed (conditionally, so that a
// heartbeat that just arrived wins), stops their tasks, and, at most every
// purgeInterval, purges ended leases older than the retention.
func (m *Manager) reap(ctx context.Context) {
	now := m.clock.Now()
	sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
	expired, err := m.store.ListLeases(sctx, LeaseFilter{State: LeaseActive, ExpiresBefore: now, Limit: reapBatch})
	cancel()
	if err != nil && ctx.Err() == nil {
		m.log.Warn("reap: list expired leases", "err", err)
	}
	var g errgroup.Group
	g.SetLimit(stopConcurrency)
	for _, l := range expired {
		g.Go(func() error {
			sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
			done := m.cache.writeLease(l.ID)
			ended, err := m.store.EndLease(sctx, l.ID, LeaseEnd{State: LeaseExpired, Reason: ReasonNotRenewed, Now: now, OnlyIfExpired: true, Read: &l})
			done()
			cancel()
			switch {
			case errors.Is(err, ErrConflict) || errors.Is(err, ErrLeaseEnded) || errors.Is(err, ErrNotFound):
				return nil // a heartbeat or another replica got there first
			case err != nil:
				if ctx.Err() == nil {
					m.log.Warn("reap: end expired lease", "lease", l.ID, "err", err)
				}
				return nil
			}
			m.metrics.reaped.Inc()
			m.log.Info("lease expired", "pool", l.Pool, "lease", l.ID, "task", l.TaskID)
			m.retire(ctx, ended, true)
			return nil
		})
	}
	_ = g.Wait() // the functions return nil

	if now.Sub(m.lastPurge) < purgeInterval {
		return
	}
	m.lastPurge = now
	sctx, cancel = context.WithTimeout(ctx, m.cfg.StoreTimeout)
	n, err := m.store.PurgeLeases(sctx, now.Add(-m.cfg.LeaseRetention))
	cancel()
	switch {
	case err != nil && ctx.Err() == nil:
		m.log.Warn("reap: purge ended leases", "err", err)
	case n > 0:
		m.log.Info("purged ended leases", "count", n)
	}
}

// sweepOrphans stops provider tasks (of the providers that pools use) that
// carry this gateway's labels but
// that no task record accounts for (a crash between launch and record, a
// record deleted by hand), once they are older than OrphanGrace. It also
// winds down the records of pools that are no longer configured: their
// idle tasks are stopped; leased ones are left to their lease.
func (m *Manager) sweepOrphans(ctx context.Context) {
	now := m.clock.Now()
	inUse := map[string]bool{}
	for _, p := range m.pools {
		inUse[p.cfg.Provider] = true
	}
	listed := map[string][]providers.Task{}
	for _, name := range slices.Sorted(maps.Keys(inUse)) {
		pctx, cancel := context.WithTimeout(ctx, m.cfg.ProviderTimeout)
		tasks, err := m.providers[name].List(pctx, "")
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				m.log.Warn("orphan sweep: list provider tasks", "provider", name, "err", err)
			}
			continue
		}
		listed[name] = tasks
	}
	// Records are read after the provider lists: a record is written before
	// its task is launched, so every listed task's record exists by now.
	recs, err := m.listTasks(ctx, "")
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("orphan sweep: read tasks", "err", err)
		}
		return
	}
	known := make(map[string]bool, 2*len(recs))
	for _, r := range recs {
		known[r.ID] = true
		if r.ProviderID != "" {
			known[r.ProviderID] = true
		}
	}
	listedIDs := map[string]bool{}
	for name, tasks := range listed {
		for _, t := range tasks {
			listedIDs[t.ID] = true
			if !m.isOrphan(t, known, now) {
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
		}
	}
	for id := range m.orphanSeen { // forget tasks the providers no longer list
		if !listedIDs[id] {
			delete(m.orphanSeen, id)
		}
	}
	m.windDownUnconfigured(ctx, recs, now)
}

// isOrphan reports whether a provider task is this gateway's, running,
// older than the grace period and unknown to the store.
func (m *Manager) isOrphan(t providers.Task, known map[string]bool, now time.Time) bool {
	// A stopped task is an orphan too: its remains (an exited container, a
	// task directory) are what Stop removes.
	if v, ok := t.Labels[providers.LabelManaged]; ok && v != "true" {
		return false
	}
	if gw := t.Labels[providers.LabelGateway]; gw != "" && gw != m.cfg.GatewayID {
		return false // another gateway fleet's task
	}
	if known[t.ID] || known[t.Name] || known[t.Labels[providers.LabelTask]] {
		return false
	}
	created := t.CreatedAt
	if created.IsZero() { // age unknown: count from when this sweep first saw it
		if created = m.orphanSeen[t.ID]; created.IsZero() {
			created = now
			m.orphanSeen[t.ID] = now
		}
	}
	return now.Sub(created) >= m.cfg.OrphanGrace
}

// windDownUnconfigured stops the idle tasks of pools that are no longer
// configured (no reconciler looks after them).
func (m *Manager) windDownUnconfigured(ctx context.Context, recs []TaskRecord, now time.Time) {
	var stop []TaskRecord
	for _, r := range recs {
		if m.pools[r.Pool] != nil {
			continue
		}
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
