package warmpool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/providers"
)

const (
	maxIdempotencyKeyLen = 255
	// roomPoll is how often an Acquire waiting for a task re-reads the
	// store, for tasks freed by other replicas (this replica's changes wake
	// it at once).
	roomPoll = 250 * time.Millisecond
)

// Acquire leases a task of req.Pool to req.Owner: it claims a ready task
// and initializes its agent (lease id, generation, env), or, when none is
// ready, launches one if the pool has room below max_total (a cold start)
// or waits for a launching task (bounded by ctx and Config.AcquireTimeout).
//
// Errors: *badinput.Error for bad input (unknown pool, lease_seconds above
// the pool's maximum, bad env or label keys, too long idempotency key);
// ErrNoCapacity when every task is leased at max_total; a
// *providers.LaunchError when the pool's image cannot be launched; store
// errors. A task whose agent fails its init is given up and another is
// tried, at most Config.AcquireAttempts times.
//
// With an IdempotencyKey that the owner has used before, Acquire returns
// that lease and replayed = true, never a second sandbox, also when two
// such requests race (a task launched by the loser goes back to the pool);
// ErrIdempotencyMismatch when the key's lease was made by a different
// request (AcquireRequest.Digest).
// Safe for concurrent use.
func (m *Manager) Acquire(ctx context.Context, req AcquireRequest) (lease Lease, replayed bool, err error) {
	start := time.Now()
	p, dur, err := m.validateAcquire(req)
	if err != nil {
		return Lease{}, false, err
	}
	l, outcome, err := m.acquire(ContextWithCaller(ctx, CallerAcquire), p, req, dur)
	if err == nil && outcome == outcomeReplayed && l.RequestDigest != "" && l.RequestDigest != req.Digest() {
		err = fmt.Errorf("key %q made sandbox %s: %w", req.IdempotencyKey, l.ID, ErrIdempotencyMismatch)
	}
	p.poke()
	if err != nil {
		outcome = outcomeError
	}
	m.metrics.acquires.WithLabelValues(p.cfg.Name, outcome).Inc()
	m.metrics.acquireSeconds.WithLabelValues(p.cfg.Name, outcome).Observe(time.Since(start).Seconds())
	if err != nil {
		return Lease{}, false, fmt.Errorf("acquire from pool %s: %w", p.cfg.Name, err)
	}
	m.cache.put(l, m.clock.Now()) // its first calls are about to look it up
	return l, outcome == outcomeReplayed, nil
}

// validateAcquire checks req and returns its pool and lease duration.
func (m *Manager) validateAcquire(req AcquireRequest) (*pool, time.Duration, error) {
	p := m.pools[req.Pool]
	if p == nil {
		if req.Pool == "" {
			return nil, 0, badinput.New("pool", "is required (configured pools: %s)", strings.Join(m.names, ", "))
		}
		return nil, 0, badinput.New("pool", "unknown pool %q (configured pools: %s)", req.Pool, strings.Join(m.names, ", "))
	}
	if req.Owner == "" {
		return nil, 0, badinput.New("owner", "is required")
	}
	secs := req.LeaseSeconds
	if secs == 0 {
		secs = p.cfg.DefaultLeaseSeconds
	}
	if secs < 1 || secs > p.cfg.MaxLeaseSeconds {
		return nil, 0, badinput.New("lease_seconds", "must be between 1 and %d for pool %q, got %d", p.cfg.MaxLeaseSeconds, p.cfg.Name, req.LeaseSeconds)
	}
	if err := validateEnv("env", req.Env); err != nil {
		return nil, 0, err
	}
	if err := validateLabels("labels", req.Labels, false); err != nil {
		return nil, 0, err
	}
	if k := req.IdempotencyKey; len(k) > maxIdempotencyKeyLen {
		return nil, 0, badinput.New("idempotency_key", "is %d characters long; at most %d are allowed", len(k), maxIdempotencyKeyLen)
	}
	for _, r := range req.IdempotencyKey {
		if r < 0x20 || r > 0x7e {
			return nil, 0, badinput.New("idempotency_key", "must be printable ASCII")
		}
	}
	return p, time.Duration(secs) * time.Second, nil
}

// acquire is Acquire after validation. It returns the lease and its
// outcome (warm, cold, replayed).
func (m *Manager) acquire(ctx context.Context, p *pool, req AcquireRequest, dur time.Duration) (Lease, string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.AcquireTimeout)
	defer cancel()
	var lastErr error
	for attempt := 0; attempt < m.cfg.AcquireAttempts; {
		res, err := m.store.Claim(ctx, m.claimRequest(p, req, dur, ""))
		if err == nil {
			if res.Replayed {
				return m.present(res.Lease), outcomeReplayed, nil
			}
			if lastErr = m.initLease(ctx, res.Lease); lastErr == nil {
				return res.Lease, outcomeWarm, nil
			}
			attempt++
			continue
		}
		if !errors.Is(err, ErrNoCapacity) {
			return Lease{}, outcomeError, fmt.Errorf("claim a ready task: %w", err)
		}
		l, outcome, full, err := m.coldStart(ctx, p, req, dur)
		switch {
		case err == nil:
			return l, outcome, nil
		case full:
			if err := m.waitForRoom(ctx, p); err != nil {
				return Lease{}, outcomeError, err
			}
		case errors.Is(err, providers.ErrInvalidSpec) || errors.Is(err, ErrUnavailable) || errors.Is(err, ErrClosed) || ctx.Err() != nil:
			return Lease{}, outcomeError, err // retrying would not help
		default:
			lastErr = err
			attempt++
		}
	}
	return Lease{}, outcomeError, fmt.Errorf("%d tasks failed to start or initialize, the last: %w", m.cfg.AcquireAttempts, lastErr)
}

// claimRequest builds the claim of a new lease (of taskID, or of any ready
// task when it is empty).
func (m *Manager) claimRequest(p *pool, req AcquireRequest, dur time.Duration, taskID string) ClaimRequest {
	now := m.clock.Now()
	id := NewLeaseID()
	env := maps.Clone(req.Env)
	if m.leaseEnv != nil {
		if extra := m.leaseEnv(id, p.relayURL); len(extra) > 0 {
			if env == nil {
				env = map[string]string{}
			}
			maps.Copy(env, extra)
		}
	}
	var digest string
	if req.IdempotencyKey != "" {
		digest = req.Digest()
	}
	return ClaimRequest{
		Pool: p.cfg.Name, TaskID: taskID, Now: now,
		Lease: Lease{
			ID: id, Owner: req.Owner, Labels: maps.Clone(req.Labels), Env: env,
			IdempotencyKey: req.IdempotencyKey, RequestDigest: digest, Duration: dur, CreatedAt: now, ExpiresAt: now.Add(dur),
		},
	}
}

// coldStart reserves a slot, launches a task, waits for its agent and
// claims it. full is true (with ErrNoCapacity) when the pool is at
// max_total.
func (m *Manager) coldStart(ctx context.Context, p *pool, req AcquireRequest, dur time.Duration) (l Lease, outcome string, full bool, err error) {
	rec := m.newTaskRecord(p)
	if err := m.store.ReserveTasks(ctx, p.cfg.Name, p.cfg.MaxTotal, []TaskRecord{rec}); err != nil {
		return Lease{}, outcomeError, errors.Is(err, ErrNoCapacity), fmt.Errorf("reserve a task: %w", err)
	}
	rec.State, rec.Version = TaskLaunching, 1
	p.setColdStart(rec.ID, true)
	defer p.setColdStart(rec.ID, false)

	lctx, cancel := context.WithTimeout(ctx, p.startupTimeout())
	rec, err = m.startTask(lctx, p, rec)
	cancel()
	if err != nil {
		return Lease{}, outcomeError, false, err
	}
	res, err := m.store.Claim(ctx, m.claimRequest(p, req, dur, rec.ID))
	if err != nil {
		if !errors.Is(err, ErrConflict) && !errors.Is(err, ErrNotFound) {
			m.giveBack(ctx, p, rec) // healthy: let another acquire have it
		}
		return Lease{}, outcomeError, false, fmt.Errorf("claim cold-started task %s: %w", rec.ID, err)
	}
	if res.Replayed {
		m.giveBack(ctx, p, rec)
		return m.present(res.Lease), outcomeReplayed, false, nil
	}
	if err := m.initLease(ctx, res.Lease); err != nil {
		return Lease{}, outcomeError, false, err
	}
	return res.Lease, outcomeCold, false, nil
}

// waitForRoom waits until a task of the pool may have become ready or a
// slot free. It returns nil at once when a task is ready, ErrNoCapacity at
// once when nothing is launching (for another caller than this replica's
// cold starts) or stopping, and ErrNoCapacity when ctx ends first.
func (m *Manager) waitForRoom(ctx context.Context, p *pool) error {
	changed := p.changed.wait() // before reading, so that no change is missed
	tasks, err := m.store.ListTasks(ctx, p.cfg.Name)
	if err != nil {
		return fmt.Errorf("read tasks: %w", err)
	}
	waitable := false
	for _, t := range tasks {
		switch {
		case t.State == TaskReady:
			return nil // became ready since the claim: claim again
		case t.State == TaskStopping || t.State == TaskLaunching && !p.isColdStart(t.ID):
			waitable = true
		}
	}
	if !waitable {
		return fmt.Errorf("all %d tasks of pool %s are leased or starting for other requests (max_total %d): %w", len(tasks), p.cfg.Name, p.cfg.MaxTotal, ErrNoCapacity)
	}
	p.poke() // the reconciler finishes stopping tasks, freeing their slots
	t := time.NewTimer(roomPoll)
	defer t.Stop()
	select {
	case <-changed:
	case <-t.C:
	case <-ctx.Done():
		return fmt.Errorf("no task of pool %s became free in time (%w): %w", p.cfg.Name, ctx.Err(), ErrNoCapacity)
	}
	return nil
}

// initLease calls the agent's /v1/init for a new lease. If it fails, the
// task is broken: the lease ends as lost (its idempotency key freed, so a
// retry can claim again) and the task is stopped.
func (m *Manager) initLease(ctx context.Context, l Lease) error {
	ictx, cancel := context.WithTimeout(ctx, m.cfg.InitTimeout)
	_, err := m.agents.Init(ictx, l.AgentURL, l.AgentToken, agentapi.InitRequest{LeaseID: l.ID, Generation: l.Generation, Env: l.Env})
	cancel()
	if err == nil {
		return nil
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StoreTimeout)
	defer cancel()
	ended, eerr := m.store.EndLease(cctx, l.ID, LeaseEnd{
		State: LeaseLost, Reason: "the agent's init failed: " + err.Error(), Now: m.clock.Now(), ForgetIdempotencyKey: true, Read: &l,
	})
	if eerr != nil {
		m.log.Warn("end lease of a task whose init failed", "pool", l.Pool, "lease", l.ID, "err", eerr)
	} else {
		m.retire(context.WithoutCancel(ctx), ended, false)
	}
	return fmt.Errorf("init agent of task %s: %w", l.TaskID, err)
}

// newTaskRecord returns the record of a task about to be launched.
func (m *Manager) newTaskRecord(p *pool) TaskRecord {
	now := m.clock.Now()
	return TaskRecord{
		ID: NewTaskID(), Pool: p.cfg.Name, Provider: p.cfg.Provider, State: TaskLaunching,
		CreatedAt: now, UpdatedAt: now, LaunchDeadline: now.Add(p.startupTimeout()),
	}
}

// compatibleAgent reports whether a health answer means ready: status ok,
// and the same major protocol version as this build (when reported).
func compatibleAgent(h agentapi.Health) error {
	if h.Status != "ok" {
		return fmt.Errorf("agent status is %q, not \"ok\"", h.Status)
	}
	major := func(v string) string { return strings.SplitN(v, ".", 2)[0] }
	if h.Version != "" && major(h.Version) != major(agentapi.Version) {
		return fmt.Errorf("agent protocol version %s is incompatible with %s: %w", h.Version, agentapi.Version, errIncompatible)
	}
	return nil
}

// errIncompatible marks an agent that will never become ready here.
var errIncompatible = errors.New("incompatible agent")
