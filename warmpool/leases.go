package warmpool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/providers"
)

// Get returns lease id of owner, in any state. A lease of another owner is
// ErrNotFound, like an unknown one. An active lease whose ExpiresAt has
// passed is returned as expired (the reaper will end it so).
//
// An active lease may come from this replica's lease cache (at most
// Config.LeaseCacheTTL old, never past its ExpiresAt): a lease that
// another replica ended within that time may still read as active here,
// but its agent, fenced or stopped when the lease ended, refuses it.
func (m *Manager) Get(ctx context.Context, id, owner string) (Lease, error) {
	return m.get(ContextWithCaller(ctx, CallerGet), id, owner)
}

// Cached returns lease id of owner when this replica's lease cache holds
// it, as Get would answer it from there, and false otherwise (then ask
// Get): a read that calls no store, so the caller needs no deadline for
// it. The gateway's fence reads every request's lease so.
func (m *Manager) Cached(id, owner string) (Lease, bool) {
	l, ok := m.cache.get(id, m.clock.Now())
	if !ok || l.Owner != owner {
		return Lease{}, false
	}
	return m.present(l), true
}

func (m *Manager) get(ctx context.Context, id, owner string) (Lease, error) {
	l, ok := m.cache.get(id, m.clock.Now())
	if !ok {
		mark := m.cache.reading()
		var err error
		if l, err = m.store.GetLease(ctx, id); err != nil {
			return Lease{}, fmt.Errorf("get lease: %w", err)
		}
		m.cache.putRead(l, m.clock.Now(), mark)
	}
	if l.Owner != owner {
		return Lease{}, fmt.Errorf("get lease %s: %w", id, ErrNotFound)
	}
	return m.present(l), nil
}

// Heartbeat moves the lease's expiry to now + its duration. ErrNotFound
// for an unknown lease or another owner's; ErrLeaseEnded (with the lease)
// once it ended or expired. The renewal is one conditional store write (by
// the lease's stored duration: no read first), never answered from the
// lease cache.
func (m *Manager) Heartbeat(ctx context.Context, id, owner string) (Lease, error) {
	ctx = ContextWithCaller(ctx, CallerHeartbeat)
	now := m.clock.Now()
	done := m.cache.writeLease(id)
	renewed, err := m.store.RenewLease(ctx, id, owner, time.Time{}, now)
	done()
	if err == nil {
		m.cache.put(renewed, now)
	}
	return m.leaseResult("heartbeat", id, renewed, err)
}

// SetExpiry moves an active lease's expiry to expiresAt, earlier or later
// (E2B's set_timeout counts a sandbox's time to live from now; Heartbeat
// only adds the lease's own duration). It reads the lease (from the lease
// cache when fresh) for its pool's max_lease_seconds, which bounds
// expiresAt - now, then makes one conditional store write. ErrNotFound for
// an unknown lease or another owner's; ErrLeaseEnded (with the lease) once
// it ended or expired; a *badinput.Error for an expiry not after now or past
// the pool's bound. The lease's duration, which later heartbeats add, is
// unchanged.
func (m *Manager) SetExpiry(ctx context.Context, id, owner string, expiresAt time.Time) (Lease, error) {
	ctx = ContextWithCaller(ctx, CallerHeartbeat)
	now := m.clock.Now()
	l, err := m.get(ctx, id, owner)
	if err != nil {
		return Lease{}, err
	}
	if l.State != LeaseActive {
		return l, fmt.Errorf("set expiry of lease %s: it is %s: %w", id, l.State, ErrLeaseEnded)
	}
	if !expiresAt.After(now) {
		return Lease{}, badinput.New("expires_at", "must be after now")
	}
	if p := m.lookupPool(ctx, l.Pool); p != nil {
		if max := time.Duration(p.cfg.MaxLeaseSeconds) * time.Second; expiresAt.Sub(now) > max {
			return Lease{}, badinput.New("expires_at", "at most %d seconds from now for pool %q (max_lease_seconds)", p.cfg.MaxLeaseSeconds, l.Pool)
		}
	}
	done := m.cache.writeLease(id)
	renewed, err := m.store.RenewLease(ctx, id, owner, expiresAt, now)
	done()
	if err == nil {
		m.cache.put(renewed, now)
	}
	return m.leaseResult("set expiry of", id, renewed, err)
}

// leaseResult maps a store answer about lease id for its owner: with
// ErrLeaseEnded the lease comes back too, and ErrLeaseNotHeld becomes
// ErrNotFound (another owner's lease does not exist for the caller).
func (m *Manager) leaseResult(action, id string, l Lease, err error) (Lease, error) {
	switch {
	case err == nil:
		return l, nil
	case errors.Is(err, ErrLeaseEnded):
		return m.present(l), fmt.Errorf("%s lease %s: %w", action, id, err)
	case errors.Is(err, ErrLeaseNotHeld):
		return Lease{}, fmt.Errorf("%s lease %s: %w", action, id, ErrNotFound)
	default:
		return Lease{}, fmt.Errorf("%s lease %s: %w", action, id, err)
	}
}

// Release ends the lease as released and stops its task, which is never
// reused. ErrNotFound for an unknown lease or another owner's. A lease that
// has ended already (or expired) is returned with ErrLeaseEnded. Stopping
// the task is best effort: if it fails, the task stays "stopping" and the
// reconciler finishes the job.
func (m *Manager) Release(ctx context.Context, id, owner string) (Lease, error) {
	ctx = ContextWithCaller(ctx, CallerRelease)
	l, err := m.get(ctx, id, owner)
	if err != nil {
		return Lease{}, err
	}
	if l.State != LeaseActive {
		return l, fmt.Errorf("release lease %s: it is %s: %w", id, l.State, ErrLeaseEnded)
	}
	done := m.cache.writeLease(id)
	ended, err := m.store.EndLease(ctx, id, LeaseEnd{State: LeaseReleased, Reason: "released by its owner", Now: m.clock.Now(), Owner: owner, Read: &l})
	done()
	if err != nil {
		return m.leaseResult("release", id, ended, err)
	}
	m.retire(context.WithoutCancel(ctx), ended, true)
	return ended, nil
}

// ByKey returns, in any state, the lease that owner's idempotency key
// names (presented as Get does): one store read of the key and its lease
// (Store.LeaseByKey), whatever the number of leases. ErrNotFound when the
// key names none, or its lease's key was forgotten (an init that failed).
func (m *Manager) ByKey(ctx context.Context, owner, key string) (Lease, error) {
	l, err := m.store.LeaseByKey(ContextWithCaller(ctx, CallerGet), owner, key)
	if err != nil {
		return Lease{}, fmt.Errorf("lease by key: %w", err)
	}
	return m.present(l), nil
}

// List returns leases matching f, newest first, at most Config.MaxListLeases
// (or f.Limit when lower). Leases are presented as Get does.
func (m *Manager) List(ctx context.Context, f LeaseFilter) ([]Lease, error) {
	if f.Limit <= 0 || f.Limit > m.cfg.MaxListLeases {
		f.Limit = m.cfg.MaxListLeases
	}
	ls, err := m.store.ListLeases(ContextWithCaller(ctx, CallerList), f)
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	out := ls[:0]
	for _, l := range ls {
		l = m.present(l)
		if f.State == "" || l.State == f.State {
			out = append(out, l)
		}
	}
	return out, nil
}

// CheckTask asks the provider whether the task of lease l still runs; the
// gateway calls it when the task's agent is unreachable. If the task
// stopped (or its record is gone), the lease ends as lost with the
// provider's reason and the ended lease is returned; otherwise the lease is
// returned as it is. A lease that is no longer active is returned as it is.
// Errors are store or provider failures; the caller has already checked
// that l belongs to its owner.
func (m *Manager) CheckTask(ctx context.Context, l Lease) (Lease, error) {
	ctx = ContextWithCaller(ctx, CallerCheckTask)
	done := m.cache.writeLease(l.ID) // the agent did not answer: read the lease afresh from now on
	defer done()
	cur, err := m.store.GetLease(ctx, l.ID)
	if err != nil {
		return l, fmt.Errorf("check task of lease %s: %w", l.ID, err)
	}
	if cur.State != LeaseActive {
		return m.present(cur), nil
	}
	reason, err := m.taskGone(ctx, cur)
	if err != nil || reason == "" {
		return m.present(cur), err
	}
	ended, err := m.store.EndLease(ctx, cur.ID, LeaseEnd{State: LeaseLost, Reason: reason, Now: m.clock.Now(), Read: &cur})
	switch {
	case errors.Is(err, ErrLeaseEnded):
		return m.present(ended), nil
	case err != nil:
		return m.present(cur), fmt.Errorf("end lost lease %s: %w", cur.ID, err)
	}
	m.log.Warn("lease lost: its task stopped", "pool", cur.Pool, "lease", cur.ID, "task", cur.TaskID, "reason", reason)
	m.retire(context.WithoutCancel(ctx), ended, false)
	return ended, nil
}

// taskGone returns why the task of an active lease no longer runs, or ""
// when it runs.
func (m *Manager) taskGone(ctx context.Context, l Lease) (string, error) {
	rec, ok, err := m.findTask(ctx, l.Pool, l.TaskID)
	switch {
	case err != nil:
		return "", err
	case !ok:
		return "its task record is gone", nil
	case rec.ProviderID == "":
		return "its task was never launched", nil
	}
	prov, ok := m.providers[rec.Provider]
	if !ok {
		return "", fmt.Errorf("task %s: provider %q is not configured", rec.ID, rec.Provider)
	}
	pctx, cancel := context.WithTimeout(ctx, m.cfg.ProviderTimeout)
	defer cancel()
	described, err := prov.Describe(pctx, []string{rec.ProviderID})
	if err != nil {
		return "", fmt.Errorf("describe task %s: %w", rec.ID, err)
	}
	for _, t := range described {
		if t.ID == rec.ProviderID && t.State != providers.TaskStopped {
			return "", nil
		}
		if t.ID == rec.ProviderID {
			return stoppedReason(t), nil
		}
	}
	return "the provider does not know its task", nil
}

// present returns l as a client should see it: an active lease past its
// expiry is shown as expired.
func (m *Manager) present(l Lease) Lease {
	if l.State == LeaseActive && !l.ExpiresAt.After(m.clock.Now()) {
		l.State = LeaseExpired
		l.Reason = ReasonNotRenewed
		l.EndedAt = l.ExpiresAt
	}
	return l
}

// Pause freezes an active lease's task, when its provider can
// (providers.Pauser: Docker's cgroup freezer), and marks the lease paused
// (Lease.PausedAt): the fence then refuses the sandbox's calls until
// Resume. The lease keeps its expiry: a paused sandbox still ends at its
// time to live, unless heartbeats or a new expiry move it. ErrConflict when
// it is paused already; a *badinput.Error when the provider cannot pause.
// The mark is written first, so that no call reaches a frozen agent on
// this replica; when the freeze fails, it is cleared again.
func (m *Manager) Pause(ctx context.Context, id, owner string) (Lease, error) {
	return m.setPaused(ctx, id, owner, true)
}

// Resume thaws a paused lease's task and clears its mark (in that order:
// the mark is cleared once the agent can answer). A *PauseStateError (an
// ErrConflict) when the store's lease is not paused.
func (m *Manager) Resume(ctx context.Context, id, owner string) (Lease, error) {
	return m.setPaused(ctx, id, owner, false)
}

func (m *Manager) setPaused(ctx context.Context, id, owner string, pause bool) (Lease, error) {
	verb := map[bool]string{true: "pause", false: "resume"}[pause]
	ctx = ContextWithCaller(ctx, CallerHeartbeat)
	l, err := m.get(ctx, id, owner)
	if err != nil {
		return Lease{}, err
	}
	if l.State != LeaseActive {
		return l, fmt.Errorf("%s lease %s: it is %s: %w", verb, id, l.State, ErrLeaseEnded)
	}
	pauser, taskID, err := m.pauserOf(ctx, l)
	if err != nil {
		return Lease{}, err
	}
	mark := func(paused bool) (Lease, error) {
		done := m.cache.writeLease(id)
		out, err := m.store.PauseLease(ctx, id, owner, paused, m.clock.Now())
		done()
		if err == nil {
			m.cache.put(out, m.clock.Now())
		}
		return out, err
	}
	if pause {
		marked, err := mark(true)
		if err != nil {
			return m.leaseResult(verb, id, marked, err)
		}
		if err := pauser.Pause(ctx, taskID); err != nil {
			if _, uerr := mark(false); uerr != nil {
				m.log.Warn("pause failed, and clearing the lease's paused mark failed too", "lease", id, "err", uerr)
			}
			return Lease{}, fmt.Errorf("pause lease %s: %w", id, err)
		}
		return m.present(marked), nil
	}
	// The store says whether it is paused (this replica's copy of the lease
	// may predate a pause made on another); thawing a running task is a
	// no-op.
	if err := pauser.Resume(ctx, taskID); err != nil {
		return Lease{}, fmt.Errorf("resume lease %s: %w", id, err)
	}
	resumed, err := mark(false)
	if err != nil {
		return m.leaseResult(verb, id, resumed, err)
	}
	return m.present(resumed), nil
}

// pauserOf returns the provider of l's task as a providers.Pauser, and the
// provider's id of the task; a *badinput.Error when that provider cannot
// pause.
func (m *Manager) pauserOf(ctx context.Context, l Lease) (providers.Pauser, string, error) {
	name, taskID := l.Provider, l.ProviderTaskID
	if name == "" || taskID == "" { // a lease from before leases named them
		rec, err := m.store.GetTask(ctx, l.TaskID)
		if err != nil {
			return nil, "", fmt.Errorf("pause lease %s: its task: %w", l.ID, err)
		}
		name, taskID = rec.Provider, rec.ProviderID
	}
	prov, err := m.providerOf(name)
	if err != nil {
		return nil, "", fmt.Errorf("pause lease %s: %w", l.ID, err)
	}
	p, ok := prov.(providers.Pauser)
	if !ok {
		return nil, "", badinput.New("sandbox", "its provider (%s) cannot pause a sandbox; Docker's can (docs/E2B.md)", name)
	}
	return p, taskID, nil
}
