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
	// roomPoll is how often, at first, the first acquire waiting for a
	// pool's task looks for a ready task, for the tasks made ready by other
	// replicas (this replica's offer theirs at once); each look that finds
	// none doubles the wait up to roomPollMax. A look is one counter read,
	// and a claim only when a task is ready: thousands of pools with
	// acquires waiting cost their counters, not a claim's queries, at most
	// every roomPollMax.
	roomPoll    = 250 * time.Millisecond
	roomPollMax = 4 * time.Second
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
	p, dur, err := m.validateAcquire(ctx, req)
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
	m.metrics.acquires.WithLabelValues(p.metric, outcome).Inc()
	m.metrics.acquireSeconds.WithLabelValues(p.metric, outcome).Observe(time.Since(start).Seconds())
	if err != nil {
		return Lease{}, false, fmt.Errorf("acquire from pool %s: %w", p.cfg.Name, err)
	}
	m.cache.put(l, m.clock.Now()) // its first calls are about to look it up
	if outcome != outcomeReplayed {
		m.noteAcquire(ctx, p)
	}
	return l, outcome == outcomeReplayed, nil
}

// validateAcquire checks req and returns its pool and lease duration.
func (m *Manager) validateAcquire(ctx context.Context, req AcquireRequest) (*pool, time.Duration, error) {
	p := m.lookupPool(ctx, req.Pool)
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
// outcome (warm, cold, replayed). It claims a ready task; when none is
// ready, it waits in the pool's acquire queue while the manager's loops run
// (they launch for the waiting acquires), or cold-starts its own task when
// they do not (Lambda, or after Close).
func (m *Manager) acquire(ctx context.Context, p *pool, req AcquireRequest, dur time.Duration) (Lease, string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.AcquireTimeout)
	defer cancel()
	if req.Layer != "" {
		return m.acquireOnLayer(ctx, p, req, dur)
	}
	if !m.loopsRun() {
		return m.acquireDirect(ctx, p, req, dur)
	}
	t := &tries{max: m.cfg.AcquireAttempts}
	for !t.spent() {
		l, outcome, retry, err := m.claimTask(ctx, p, req, dur, "", outcomeWarm)
		switch {
		case err == nil:
			return l, outcome, nil
		case retry:
			t.fail(err)
		case errors.Is(err, ErrNoCapacity):
			return m.await(ctx, p, req, dur, t)
		default:
			return Lease{}, outcomeError, fmt.Errorf("claim a ready task: %w", err)
		}
	}
	return Lease{}, outcomeError, t.error()
}

// tries counts the tasks one acquire tried that failed (init failed, the
// launch failed), at most max.
type tries struct {
	max, n int
	last   error
}

func (t *tries) fail(err error) { t.n, t.last = t.n+1, err }
func (t *tries) spent() bool    { return t.n >= t.max }
func (t *tries) error() error {
	return fmt.Errorf("%d tasks failed to start or initialize, the last: %w", t.n, t.last)
}

// claimTask claims taskID (or any ready task when it is empty) for req and
// initializes its agent; outcome is the acquire's outcome when it does.
// retry is true when the task's agent failed its init (the lease ended as
// lost and the task is stopped): another task may be tried.
func (m *Manager) claimTask(ctx context.Context, p *pool, req AcquireRequest, dur time.Duration, taskID, outcome string) (Lease, string, bool, error) {
	res, err := m.claim(ctx, p, m.claimRequest(p, req, dur, taskID))
	if err != nil {
		return Lease{}, outcomeError, false, err
	}
	if res.Replayed {
		return m.present(res.Lease), outcomeReplayed, false, nil
	}
	if err := m.initLease(ctx, res.Lease); err != nil {
		return Lease{}, outcomeError, true, err
	}
	return res.Lease, outcome, false, nil
}

// staleRounds bounds the claims one claim call makes while each meets only
// ready tasks of another configuration (StaleScan of them each).
const staleRounds = 4

// claim is the store's Claim of req for p: the stale tasks a claim meets
// (TaskRecord.Spec) are retired (retireStale), and a claim that met only
// those is made again, at most staleRounds times.
func (m *Manager) claim(ctx context.Context, p *pool, req ClaimRequest) (ClaimResult, error) {
	for round := 1; ; round++ {
		res, err := m.store.Claim(ctx, req)
		m.retireStale(p, res.Stale)
		if err == nil || len(res.Stale) == 0 || !errors.Is(err, ErrNoCapacity) || round == staleRounds {
			return res, err
		}
	}
}

// await waits in the pool's acquire queue until a task is offered to it (a
// task this replica made ready), or, as the queue's head, until a claim of
// any ready task succeeds; the waiting acquires are the demand that the
// refills launch for. It fails at once when the queue is full, or when the
// pool is at max_total with every task leased, and with ErrNoCapacity when
// ctx ends first. A failed launch handed to it counts as a failed task
// (one that cannot succeed, ErrInvalidSpec, fails it).
func (m *Manager) await(ctx context.Context, p *pool, req AcquireRequest, dur time.Duration, t *tries) (Lease, string, error) {
	if err := m.waitable(ctx, p); err != nil {
		return Lease{}, outcomeError, err
	}
	w, ok := p.queue.join()
	if !ok {
		m.metrics.queueFull.WithLabelValues(p.metric).Inc()
		p.log.Warn("acquire refused: the pool's acquire queue is full", "limit", m.cfg.AcquireQueue, "variable", "QUARRY_ACQUIRE_QUEUE")
		return Lease{}, outcomeError, fmt.Errorf("%d acquires of pool %s wait already on this gateway (QUARRY_ACQUIRE_QUEUE): %w", m.cfg.AcquireQueue, p.cfg.Name, ErrNoCapacity)
	}
	m.metrics.queueLength.WithLabelValues(p.metric).Set(float64(p.queue.len()))
	defer func() {
		p.queue.leave(w)
		m.metrics.queueLength.WithLabelValues(p.metric).Set(float64(p.queue.len()))
	}()
	p.poke() // demand: the pool launches for it
	var timer *time.Timer
	var tick <-chan time.Time
	poll := roomPoll
	arm := func() { // only the head polls
		if timer == nil && p.queue.isHead(w) {
			timer = time.NewTimer(poll)
			tick = timer.C
		}
	}
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	// claimAny is the head's claim of any ready task: done when the
	// acquire has its answer.
	claimAny := func() (l Lease, outcome string, done bool, err error) {
		l, outcome, retry, err := m.claimTask(ctx, p, req, dur, "", outcomeCold)
		switch {
		case err == nil:
			return l, outcome, true, nil
		case retry:
			t.fail(err)
			return Lease{}, outcomeError, t.spent(), t.error()
		case errors.Is(err, ErrNoCapacity):
			if err := m.waitable(ctx, p); err != nil {
				p.queue.fail(err, p.queue.len()) // the same holds for every waiter
				return Lease{}, outcomeError, true, err
			}
			p.poke()
			return Lease{}, outcomeError, false, nil
		}
		return Lease{}, outcomeError, true, fmt.Errorf("claim a ready task: %w", err)
	}
	arm()
	for {
		select {
		case o := <-w.offers:
			if o.err != nil {
				if errors.Is(o.err, providers.ErrInvalidSpec) || errors.Is(o.err, ErrNoCapacity) {
					return Lease{}, outcomeError, o.err // waiting or retrying would not help
				}
				t.fail(o.err)
				if t.spent() {
					return Lease{}, outcomeError, t.error()
				}
				p.queue.rejoin(w)
				continue
			}
			l, outcome, retry, err := m.claimTask(ctx, p, req, dur, o.taskID, outcomeCold)
			switch {
			case err == nil:
				return l, outcome, nil
			case retry:
				if t.fail(err); t.spent() {
					return Lease{}, outcomeError, t.error()
				}
			case errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound):
				// Claimed by another acquire meanwhile: wait for the next.
			default:
				return Lease{}, outcomeError, fmt.Errorf("claim task %s: %w", o.taskID, err)
			}
			p.queue.rejoin(w)
		case <-w.wake:
			if p.queue.takeNow(w) && p.queue.isHead(w) {
				if l, outcome, done, err := claimAny(); done {
					return l, outcome, err
				}
			}
			arm()
		case <-tick:
			timer, tick = nil, nil
			if p.queue.isHead(w) {
				ready, err := m.readyNow(ctx, p)
				switch {
				case err != nil:
					p.queue.fail(err, p.queue.len()) // the same holds for every waiter
					return Lease{}, outcomeError, err
				case !ready:
					poll = min(2*poll, roomPollMax)
					p.poke()
				default:
					poll = roomPoll
					if l, outcome, done, err := claimAny(); done {
						return l, outcome, err
					}
				}
			}
			arm()
		case <-ctx.Done():
			return Lease{}, outcomeError, fmt.Errorf("no task of pool %s became free in time (%w): %w", p.cfg.Name, ctx.Err(), ErrNoCapacity)
		case <-m.bg.Done(): // the manager closed: no more launches for the queue
			p.queue.leave(w)
			return m.acquireDirect(ctx, p, req, dur)
		}
	}
}

// readyNow reports whether a task of the pool is ready (one read of the
// counts), and ErrNoCapacity when every task is leased at max_total (none
// can become free for a waiting acquire); a store error is nil and false
// (the next look decides).
func (m *Manager) readyNow(ctx context.Context, p *pool) (bool, error) {
	c, err := m.countTasks(ctx, p)
	if err != nil {
		return false, nil
	}
	return c.Ready > 0, waitableCounts(p, c)
}

// countTasks reads the pool's counts once one of the replica's
// Config.CountReads slots is free (or ctx ends): the reads of waiting
// acquires and of refills, however many pools wait, keep that many in
// flight at most.
func (m *Manager) countTasks(ctx context.Context, p *pool) (TaskCounts, error) {
	select {
	case m.countReads <- struct{}{}:
	default:
		m.metrics.countWaiting.Inc()
		select {
		case m.countReads <- struct{}{}:
			m.metrics.countWaiting.Dec()
		case <-ctx.Done():
			m.metrics.countWaiting.Dec()
			return TaskCounts{}, fmt.Errorf("count tasks of pool %s: waiting for a read slot (QUARRY_COUNT_READS): %w", p.cfg.Name, ctx.Err())
		}
	}
	defer func() { <-m.countReads }()
	return m.store.CountTasks(ctx, p.cfg.Name)
}

// waitable returns nil when a task of the pool may become free for an
// acquire that waits (one is ready, launching or stopping, or the pool has
// room), and ErrNoCapacity when every task is leased at max_total: one
// read of the counts.
func (m *Manager) waitable(ctx context.Context, p *pool) error {
	c, err := m.countTasks(ctx, p)
	if err != nil {
		return fmt.Errorf("count tasks: %w", err)
	}
	return waitableCounts(p, c)
}

// waitableCounts is waitable's decision on counts c.
func waitableCounts(p *pool, c TaskCounts) error {
	if c.Ready > 0 || c.Launching > 0 || c.Stopping > 0 || c.Total() < p.cfg.MaxTotal {
		return nil
	}
	return fmt.Errorf("all %d tasks of pool %s are leased (max_total %d): %w", c.Total(), p.cfg.Name, p.cfg.MaxTotal, ErrNoCapacity)
}

// loopsRun reports whether the manager's background loops run (Start,
// and not yet Close): they launch for waiting acquires.
func (m *Manager) loopsRun() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.started && !m.closed
}

// acquireDirect is the acquire of a manager whose loops do not run: it
// claims a ready task, or launches its own (a cold start) when the pool
// has room, or waits for a task to free.
func (m *Manager) acquireDirect(ctx context.Context, p *pool, req AcquireRequest, dur time.Duration) (Lease, string, error) {
	var lastErr error
	for attempt := 0; attempt < m.cfg.AcquireAttempts; {
		l, outcome, retry, err := m.claimTask(ctx, p, req, dur, "", outcomeWarm)
		switch {
		case err == nil:
			return l, outcome, nil
		case retry:
			lastErr = err
			attempt++
			continue
		case !errors.Is(err, ErrNoCapacity):
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
		Pool: p.cfg.Name, TaskID: taskID, Spec: p.digest, Now: now,
		Lease: Lease{
			ID: id, Owner: req.Owner, Image: p.cfg.Image, Labels: maps.Clone(req.Labels), Env: env,
			IdempotencyKey: req.IdempotencyKey, RequestDigest: digest, Duration: dur, CreatedAt: now, ExpiresAt: now.Add(dur),
		},
	}
}

// coldStart reserves a slot, launches a task, waits for its agent and
// claims it. full is true (with ErrNoCapacity) when the pool is at
// max_total.
//
// A request that names a layer gets a task started on it: its record holds
// the layer's digest, and a task the claim does not take is stopped, never
// given back (no other acquire may have it).
func (m *Manager) coldStart(ctx context.Context, p *pool, req AcquireRequest, dur time.Duration) (l Lease, outcome string, full bool, err error) {
	rec := m.newTaskRecord(p)
	if req.Layer != "" {
		rec.Spec = p.layerDigest(req.Layer)
	}
	giveBack := func(rec TaskRecord) {
		if req.Layer != "" {
			m.markStopping(ctx, p, rec, "started on a layer for an acquire that did not take it")
			return
		}
		m.giveBack(ctx, p, rec)
	}
	if err := m.reserve(ctx, p, []TaskRecord{rec}); err != nil {
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
	creq := m.claimRequest(p, req, dur, rec.ID)
	creq.Spec = rec.Spec
	res, err := m.claim(ctx, p, creq)
	if err != nil {
		if !errors.Is(err, ErrConflict) && !errors.Is(err, ErrNotFound) {
			giveBack(rec) // healthy: another acquire may have it (one on a layer: stopped)
		}
		return Lease{}, outcomeError, false, fmt.Errorf("claim cold-started task %s: %w", rec.ID, err)
	}
	if res.Replayed {
		giveBack(rec)
		return m.present(res.Lease), outcomeReplayed, false, nil
	}
	if err := m.initLease(ctx, res.Lease); err != nil {
		return Lease{}, outcomeError, false, err
	}
	return res.Lease, outcomeCold, false, nil
}

// waitForRoom waits until a task of the pool may have become ready or a
// slot free (the direct path). It returns nil at once when a task is ready
// or the pool has room, ErrNoCapacity at once when nothing is launching
// (for another caller than this replica's cold starts) or stopping, and
// ErrNoCapacity when ctx ends first. It reads the counts, not the tasks.
func (m *Manager) waitForRoom(ctx context.Context, p *pool) error {
	changed := p.changed.wait() // before reading, so that no change is missed
	c, err := m.countTasks(ctx, p)
	if err != nil {
		return fmt.Errorf("count tasks: %w", err)
	}
	if c.Ready > 0 || c.Total() < p.cfg.MaxTotal {
		return nil // became ready or free since the claim: claim again
	}
	if c.Stopping == 0 && c.Launching <= p.coldStartCount() {
		return fmt.Errorf("all %d tasks of pool %s are leased or starting for other requests (max_total %d): %w", c.Total(), p.cfg.Name, p.cfg.MaxTotal, ErrNoCapacity)
	}
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
