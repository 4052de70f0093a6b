package warmpool

import (
	"context"
	"errors"
	"time"

	"golang.org/x/sync/errgroup"
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
