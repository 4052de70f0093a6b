package warmpool

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"
)

// Names of the locks (Store.TryLock) that gate background work. Every
// replica runs the same loops; a pass runs only on the replica that holds
// its lock, so N replicas do the work of one. Correctness never rests on a
// lock: every decision is still a conditional store write, so a pass that
// outlives its lock races another replica's and loses cleanly.
const (
	lockPoolPrefix = "pool/"   // + pool name: the pool's reconciler, full passes and refills
	lockReaper     = "reaper"  // ends expired leases, purges old ones
	lockOrphans    = "orphans" // the orphan sweep
	// lockClassPrefix (ondemand.go) + class name: a class's loop and the
	// passes of its on-demand pools.
)

// replicaIDPattern is what a replica id may look like (the holder of locks).
var replicaIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// DefaultReplicaID returns an id for this process that no other replica
// shares: the host name, the pid and 32 random bits, e.g.
// "gw-7f9c-4242-abcdefg". Safe for concurrent use.
func DefaultReplicaID() string {
	host, err := os.Hostname()
	if err != nil {
		host = ""
	}
	host = strings.Map(func(r rune) rune {
		if r < 0x80 && (r == '.' || r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return r
		}
		return -1
	}, host)
	if host == "" {
		host = "replica"
	}
	return fmt.Sprintf("%s-%d-%s", host[:min(len(host), 64)], os.Getpid(), randomID()[:7])
}

// lockSet remembers which locks this replica held at its last attempt, for
// the logs, the quarry_lock_held gauge and Close (which hands them over).
type lockSet struct {
	mu      sync.Mutex
	held    map[string]bool
	failing map[string]bool // the last attempt failed (logged once per failure streak)
}

// locked returns fn gated on lock name: it runs only on the replica that
// holds (or now takes) the lock. interval is how often the caller runs it.
func (m *Manager) locked(name string, interval time.Duration, fn func(context.Context)) func(context.Context) {
	return func(ctx context.Context) {
		if m.holdLock(ctx, name, interval) {
			m.metrics.lockedPasses.WithLabelValues(name).Inc()
			fn(ctx)
		}
	}
}

// holdLock takes or renews lock name for this replica, for LockTTL or
// twice interval, whichever is longer, so that a holder renews it well
// before it expires. It reports whether this replica holds it; a store
// error counts as not holding (the pass is skipped; the next one tries
// again).
func (m *Manager) holdLock(ctx context.Context, name string, interval time.Duration) bool {
	ttl := max(m.cfg.LockTTL, 2*interval)
	sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
	ok, err := m.store.TryLock(sctx, name, m.cfg.ReplicaID, ttl, m.clock.Now())
	cancel()
	outcome, lost := "held", ""
	switch {
	case err != nil && ctx.Err() != nil:
		// The caller is closing (or its pass ended): a canceled call says
		// nothing of the store nor of the lock, which unlockAll releases.
		m.metrics.lockAttempts.WithLabelValues(name, "canceled").Inc()
		return false
	case err != nil:
		outcome, ok, lost = "error", false, lockLostToStore
		if m.setFailing(name, true) && ctx.Err() == nil {
			m.log.Warn("take lock: skipping passes until the store answers", "lock", name, "err", err)
		}
	case !ok:
		outcome, lost = "busy", lockLostToAnother
	}
	if err == nil && m.setFailing(name, false) {
		m.log.Info("take lock: the store answers again", "lock", name)
	}
	m.metrics.lockAttempts.WithLabelValues(name, outcome).Inc()
	m.setHeld(name, ok, lost)
	return ok
}

// Why this replica stopped holding a lock: the log line of setHeld.
const (
	lockLostToAnother = "lock no longer held: another replica runs the job"
	lockLostToStore   = "lock no longer held: the store did not answer; this replica skips the job until it does"
	lockReleased      = "lock released: this replica is closing (another replica, if any, takes the job over now)"
	lockLeftToExpire  = "lock given up: this replica is closing (another replica, if any, takes the job over when it expires)"
)

// setFailing records whether the last attempt on lock name failed and
// reports whether that changed.
func (m *Manager) setFailing(name string, failing bool) bool {
	m.locks.mu.Lock()
	defer m.locks.mu.Unlock()
	if m.locks.failing[name] == failing {
		return false
	}
	if failing {
		m.locks.failing[name] = true
	} else {
		delete(m.locks.failing, name)
	}
	return true
}

// holds reports whether this replica held lock name at its last attempt.
func (m *Manager) holds(name string) bool {
	m.locks.mu.Lock()
	defer m.locks.mu.Unlock()
	return m.locks.held[name]
}

// setHeld records the outcome of an attempt on lock name and logs changes:
// lost is the line of a lock no longer held (lockLostToAnother, ...).
func (m *Manager) setHeld(name string, held bool, lost string) {
	m.locks.mu.Lock()
	was := m.locks.held[name]
	if held {
		m.locks.held[name] = true
	} else {
		delete(m.locks.held, name)
	}
	m.locks.mu.Unlock()
	if was == held {
		return
	}
	if held {
		m.metrics.lockHeld.WithLabelValues(name).Set(1)
		m.log.Info("lock taken: this replica runs the job", "lock", name)
		return
	}
	m.metrics.lockHeld.WithLabelValues(name).Set(0)
	m.log.Info(lost, "lock", name)
}

// unlockAll releases every lock this replica may hold, so that another
// replica takes the work over at once instead of after LockTTL. It tries
// every lock name of this manager, not only those it held at its last
// attempt: an attempt that failed (a canceled context at Close) may have
// renewed the lock all the same, and Unlock releases only this replica's.
// Best effort: a lock that cannot be released expires.
func (m *Manager) unlockAll(ctx context.Context) {
	names := []string{lockReaper, lockOrphans}
	for _, pool := range m.names {
		names = append(names, lockPoolPrefix+pool)
	}
	for _, class := range m.classNames {
		names = append(names, lockClassPrefix+class)
	}
	for _, name := range names {
		sctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
		err := m.store.Unlock(sctx, name, m.cfg.ReplicaID)
		cancel()
		lost := lockReleased
		if err != nil {
			m.log.Warn("release lock: it will expire instead", "lock", name, "err", err)
			lost = lockLeftToExpire
		}
		m.setHeld(name, false, lost)
	}
}
