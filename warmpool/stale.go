package warmpool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/time/rate"

	"github.com/quarryhq/quarry/providers"
)

// Stale tasks: a task records the digest of the pool configuration it was
// launched for (TaskRecord.Spec). When a pool's configuration changes (its
// provider, image, resources, env or options), the tasks launched for the
// old one are stale: claims pass over them and retire the ready ones
// (ClaimRequest.Spec), the reconciler's walk retires those it meets, and a
// lease held on one keeps working until it ends, when its task stops like
// any other. A stale task is stopped by the provider that made it: one the
// pools still use, or one built for the purpose (Deps.ExtraProvider); when
// none can be, the task is reported once and its record kept.

// maxReported bounds the tasks unstoppable remembers having reported.
const maxReported = 10000

// extraRetry is how long a provider that could not be built stays
// unbuilt before the next attempt.
const extraRetry = time.Minute

// errNoProvider marks a task whose provider is not configured and could
// not be built.
var errNoProvider = errors.New("provider not configured")

// stale reports whether rec was launched for another configuration of p.
func (p *pool) stale(rec TaskRecord) bool { return rec.Spec != p.digest }

// retireStale finishes the stale ready tasks a claim moved to stopping: it
// counts and logs them and stops them in the background (the reconciler's
// walk stops what this leaves, e.g. after Close).
func (m *Manager) retireStale(p *pool, recs []TaskRecord) {
	if len(recs) == 0 {
		return
	}
	m.metrics.staleTasks.WithLabelValues(p.metric, "retired").Add(float64(len(recs)))
	p.log.Info("retiring ready tasks launched for another configuration of the pool", "tasks", len(recs),
		"provider", recs[0].Provider, "spec", recs[0].Spec, "pool_spec", p.digest)
	m.goBackground(CallerReconcile, func(ctx context.Context) { m.stopAll(ctx, recs) })
}

// noteStaleLease logs, once per pool, that a lease holds a task of another
// configuration: it keeps working until it ends.
func (m *Manager) noteStaleLease(p *pool, rec TaskRecord) {
	p.mu.Lock()
	seen := p.staleLeaseSeen
	p.staleLeaseSeen = true
	p.mu.Unlock()
	if !seen {
		p.log.Warn("a lease holds a task launched for another configuration of the pool; such leases keep working until they end, and their tasks then stop",
			"lease", rec.LeaseID, "task", rec.ID, "provider", rec.Provider, "spec", rec.Spec, "pool_spec", p.digest)
	}
}

// providerOf returns the provider named name: one the pools use, or one
// built by Deps.ExtraProvider on first need (kept until Close; a failed
// build is tried again after extraRetry). The error wraps errNoProvider.
func (m *Manager) providerOf(name string) (providers.Provider, error) {
	if prov, ok := m.providers[name]; ok {
		return prov, nil
	}
	if m.extraProvider == nil {
		return nil, fmt.Errorf("provider %q: %w (no pool uses it)", name, errNoProvider)
	}
	m.extraMu.Lock()
	defer m.extraMu.Unlock()
	if prov, ok := m.extras[name]; ok {
		return prov, nil
	}
	if f, ok := m.extraFailed[name]; ok && time.Since(f.at) < extraRetry {
		return nil, f.err
	}
	if m.extrasClosed {
		return nil, fmt.Errorf("provider %q: %w (the manager is closed)", name, errNoProvider)
	}
	prov, err := m.extraProvider(name)
	if err != nil {
		err = fmt.Errorf("provider %q: %w (no pool uses it, and building it failed: %w)", name, errNoProvider, err)
		m.extraFailed[name] = extraFailure{at: time.Now(), err: err}
		return nil, err
	}
	m.log.Info("built a provider no pool uses, to stop the tasks it made", "provider", name)
	m.extras[name] = prov
	return prov, nil
}

// describeLimit is the describe rate of provider name (Config.DescribeRate
// each, extra providers included).
func (m *Manager) describeLimit(name string) *rate.Limiter {
	if l, ok := m.describeLimits[name]; ok {
		return l
	}
	m.extraMu.Lock()
	defer m.extraMu.Unlock()
	l, ok := m.extraLimits[name]
	if !ok {
		l = newDescribeLimit(m.cfg)
		m.extraLimits[name] = l
	}
	return l
}

// extraFailure is a failed build of an extra provider.
type extraFailure struct {
	at  time.Time
	err error
}

// closeExtras closes the providers providerOf built; none is built after.
func (m *Manager) closeExtras(ctx context.Context) {
	m.extraMu.Lock()
	defer m.extraMu.Unlock()
	m.extrasClosed = true
	for name, prov := range m.extras {
		if c, ok := prov.(providers.Closer); ok {
			if err := c.Close(ctx); err != nil {
				m.log.Warn("close provider", "provider", name, "err", err)
			}
		}
	}
	m.extras = map[string]providers.Provider{}
}

// unstoppable reports a task whose provider is not configured, once per
// task on this replica: it is left running and its record kept.
func (m *Manager) unstoppable(rec TaskRecord, err error) {
	m.extraMu.Lock()
	seen := m.reported[rec.ID] || len(m.reported) >= maxReported
	if !seen {
		m.reported[rec.ID] = true
	}
	m.extraMu.Unlock()
	if seen {
		return
	}
	m.metrics.staleTasks.WithLabelValues(rec.Pool, "unstoppable").Inc()
	m.log.Warn("cannot stop a task: its provider is not configured; it is left running and its record kept (configure the provider, e.g. QUARRY_PROVIDER, to stop it)",
		"pool", rec.Pool, "task", rec.ID, "provider", rec.Provider, "provider_task", rec.ProviderID, "err", err)
}
