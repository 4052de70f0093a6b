package membroker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/quarryhq/quarry/internal/clock"
	"github.com/quarryhq/quarry/modelservice"
)

var (
	_ modelservice.Broker = (*Broker)(nil)
	_ modelservice.Purger = (*Broker)(nil)
)

// Defaults of Config's zero fields.
const (
	DefaultRetention = 24 * time.Hour
	DefaultMaxBytes  = 1 << 30
)

// Config tunes the Broker. Zero fields take the defaults.
type Config struct {
	// Retention is how long an exchange stays in its transcript after its
	// request's deadline (default 24 h).
	Retention time.Duration
	// MaxBytes bounds the bodies held (requests and answers of every
	// exchange not yet purged); Submit and Record return ErrFull past it
	// (default 1 GiB).
	MaxBytes int64
	// Clock tells the time (nil: clock.System).
	Clock clock.Clock
}

// Broker is the in-memory broker: one process, nothing survives a restart.
// Safe for concurrent use.
type Broker struct {
	cfg Config

	mu      sync.Mutex
	closed  bool
	done    chan struct{}       // closed by Close
	entries map[string]*entry   // by request id
	leases  map[string][]*entry // each lease's exchanges, in id order
	queue   []*entry            // pending and claimed requests, in id order
	changed chan struct{}       // closed and replaced when the queue gains a visible request
	bytes   int64               // bodies held
}

// entry is one exchange; mu guards every field but ended (closed once).
type entry struct {
	ex           modelservice.Exchange
	claimedUntil time.Time
	ended        chan struct{}
}

// WithDefaults returns c with every zero (or negative) field set to its
// default.
func (c Config) WithDefaults() Config {
	if c.Retention <= 0 {
		c.Retention = DefaultRetention
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.Clock == nil {
		c.Clock = clock.System{}
	}
	return c
}

// New returns an empty Broker.
func New(cfg Config) *Broker {
	return &Broker{
		cfg: cfg.WithDefaults(), done: make(chan struct{}), entries: map[string]*entry{}, leases: map[string][]*entry{},
		changed: make(chan struct{}),
	}
}

func size(ex *modelservice.Exchange) int64 {
	n := int64(len(ex.Body))
	if ex.Response != nil {
		n += int64(len(ex.Response.Body))
	}
	return n
}

// Submit queues req. ErrConflict for a known id, ErrFull over MaxBytes,
// ErrClosed after Close.
func (b *Broker) Submit(_ context.Context, req modelservice.Request) error {
	ex := modelservice.Exchange{Request: cloneRequest(req), State: modelservice.StatePending}
	b.mu.Lock()
	defer b.mu.Unlock()
	e, err := b.add(ex)
	if err != nil {
		return fmt.Errorf("submit model request %s: %w", req.ID, err)
	}
	b.queue = insertSorted(b.queue, e)
	b.wakeClaimers()
	return nil
}

// Record stores a finished exchange.
func (b *Broker) Record(_ context.Context, ex modelservice.Exchange) error {
	ex.Request = cloneRequest(ex.Request)
	if ex.Response != nil {
		r := *ex.Response
		r.Body = slices.Clone(r.Body)
		ex.Response = &r
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	e, err := b.add(ex)
	if err != nil {
		return fmt.Errorf("record model exchange %s: %w", ex.ID, err)
	}
	close(e.ended)
	return nil
}

// add inserts a new entry; b.mu is held.
func (b *Broker) add(ex modelservice.Exchange) (*entry, error) {
	switch {
	case b.closed:
		return nil, modelservice.ErrClosed
	case b.entries[ex.ID] != nil:
		return nil, modelservice.ErrConflict
	case b.bytes+size(&ex) > b.cfg.MaxBytes:
		return nil, fmt.Errorf("%w: %d bytes held, limit %d", modelservice.ErrFull, b.bytes, b.cfg.MaxBytes)
	}
	e := &entry{ex: ex, ended: make(chan struct{})}
	b.entries[ex.ID] = e
	b.leases[ex.LeaseID] = insertSorted(b.leases[ex.LeaseID], e)
	b.bytes += size(&ex)
	return e, nil
}

// insertSorted inserts e into list, kept in id order (ids sort by time, so
// this is almost always an append).
func insertSorted(list []*entry, e *entry) []*entry {
	i := sort.Search(len(list), func(i int) bool { return list[i].ex.ID > e.ex.ID })
	return slices.Insert(list, i, e)
}

// wakeClaimers wakes every waiting Claim; b.mu is held.
func (b *Broker) wakeClaimers() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// Claim claims up to q.Max visible requests of q.Owner, waiting up to
// q.Wait for the first.
func (b *Broker) Claim(ctx context.Context, q modelservice.ClaimQuery) ([]modelservice.Request, error) {
	q = q.Normalized()
	var timeout <-chan time.Time
	if q.Wait > 0 {
		t := time.NewTimer(q.Wait)
		defer t.Stop()
		timeout = t.C
	}
	for {
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return nil, fmt.Errorf("claim model requests: %w", modelservice.ErrClosed)
		}
		out, next := b.claimLocked(q)
		changed := b.changed
		b.mu.Unlock()
		if len(out) > 0 || q.Wait <= 0 {
			return out, nil
		}
		// Nothing visible: wait for a new request, a claim that expires, the
		// wait's end or ctx.
		if err := b.waitClaimable(ctx, changed, next, timeout); err != nil {
			if errors.Is(err, modelservice.ErrClosed) {
				return nil, fmt.Errorf("claim model requests: %w", err)
			}
			return nil, nil
		}
	}
}

// waitClaimable waits for a change of the queue, the time next (when a
// claim expires), the claim's timeout, ctx or Close. It returns nil when
// the queue should be looked at again.
func (b *Broker) waitClaimable(ctx context.Context, changed <-chan struct{}, next time.Time, timeout <-chan time.Time) error {
	var wake <-chan time.Time
	if !next.IsZero() {
		t := time.NewTimer(max(next.Sub(b.cfg.Clock.Now()), time.Millisecond))
		defer t.Stop()
		wake = t.C
	}
	select {
	case <-changed:
		return nil
	case <-wake:
		return nil
	case <-timeout:
		return context.DeadlineExceeded
	case <-ctx.Done():
		return ctx.Err()
	case <-b.done:
		return modelservice.ErrClosed
	}
}

// claimLocked claims what is visible now and returns it, with the earliest
// time at which a hidden matching request becomes visible (zero: none).
// b.mu is held.
func (b *Broker) claimLocked(q modelservice.ClaimQuery) ([]modelservice.Request, time.Time) {
	now := b.cfg.Clock.Now()
	var (
		out   []modelservice.Request
		bytes int64
		next  time.Time
	)
	keep := b.queue[:0]
	for _, e := range b.queue {
		if !now.Before(e.ex.Deadline) {
			b.endLocked(e, modelservice.StateExpired, "no answer within the request's timeout", now)
			continue
		}
		keep = append(keep, e)
		if e.ex.Owner != q.Owner || !q.Matches(e.ex.Pool, e.ex.Labels) {
			continue
		}
		if e.ex.State == modelservice.StateClaimed && now.Before(e.claimedUntil) {
			if next.IsZero() || e.claimedUntil.Before(next) {
				next = e.claimedUntil
			}
			continue
		}
		if len(out) >= q.Max || !modelservice.WithinBytes(len(out), bytes, int64(len(e.ex.Body)), q.MaxBytes) {
			continue
		}
		e.ex.State = modelservice.StateClaimed
		e.ex.ClaimedAt = now
		e.ex.Attempt++
		e.claimedUntil = now.Add(q.Visibility)
		bytes += int64(len(e.ex.Body))
		r := e.ex.Request
		r.Body = slices.Clone(r.Body)
		r.Labels = maps.Clone(r.Labels)
		out = append(out, r)
	}
	clear(b.queue[len(keep):])
	b.queue = keep
	return out, next
}

// endLocked moves e to a final state and wakes its waiter; the caller
// removes it from the queue. b.mu is held.
func (b *Broker) endLocked(e *entry, state modelservice.State, reason string, now time.Time) {
	e.ex.State = state
	e.ex.Reason = reason
	e.ex.EndedAt = now
	close(e.ended)
}

// dequeue removes e from the queue; b.mu is held.
func (b *Broker) dequeue(e *entry) {
	if i := slices.Index(b.queue, e); i >= 0 {
		b.queue = slices.Delete(b.queue, i, i+1)
	}
}

// Respond answers request id of owner.
func (b *Broker) Respond(_ context.Context, id, owner string, resp modelservice.Response) error {
	resp.Body = slices.Clone(resp.Body)
	b.mu.Lock()
	defer b.mu.Unlock()
	e, err := b.live(id)
	if err != nil || e.ex.Owner != owner {
		return fmt.Errorf("answer model request %s: %w", id, modelservice.ErrNotFound)
	}
	if err := b.checkOpen(e); err != nil {
		return fmt.Errorf("answer model request %s: %w", id, err)
	}
	if b.bytes+int64(len(resp.Body)) > b.cfg.MaxBytes {
		return fmt.Errorf("answer model request %s: %w: %d bytes held, limit %d", id, modelservice.ErrFull, b.bytes, b.cfg.MaxBytes)
	}
	b.bytes += int64(len(resp.Body))
	e.ex.Response = &resp
	b.dequeue(e)
	b.endLocked(e, modelservice.StateAnswered, "", resp.AnsweredAt)
	return nil
}

// checkOpen returns why e can no longer be answered (nil while it can),
// ending it as expired when its deadline has passed. b.mu is held.
func (b *Broker) checkOpen(e *entry) error {
	switch {
	case e.ex.State == modelservice.StateAnswered:
		return modelservice.ErrAnswered
	case e.ex.State.Ended():
		return fmt.Errorf("%w (%s: %s)", modelservice.ErrGone, e.ex.State, e.ex.Reason)
	}
	if now := b.cfg.Clock.Now(); !now.Before(e.ex.Deadline) {
		b.dequeue(e)
		b.endLocked(e, modelservice.StateExpired, "no answer within the request's timeout", now)
		return fmt.Errorf("%w (expired)", modelservice.ErrGone)
	}
	return nil
}

// live returns the entry of id unless unknown or past its retention; b.mu
// is held.
func (b *Broker) live(id string) (*entry, error) {
	e := b.entries[id]
	if e == nil || !b.retained(e, b.cfg.Clock.Now()) {
		return nil, modelservice.ErrNotFound
	}
	return e, nil
}

// retained reports whether e is still within its retention at now: the
// retention counts from the request's deadline, which no exchange outlives
// unended.
func (b *Broker) retained(e *entry, now time.Time) bool {
	return now.Before(e.ex.Deadline.Add(b.cfg.Retention))
}

// Await waits until request id ends.
func (b *Broker) Await(ctx context.Context, id string) (modelservice.Response, error) {
	b.mu.Lock()
	e, err := b.live(id)
	b.mu.Unlock()
	if err != nil {
		return modelservice.Response{}, fmt.Errorf("await model request %s: %w", id, err)
	}
	select {
	case <-e.ended:
	case <-ctx.Done():
		return modelservice.Response{}, ctx.Err()
	case <-b.done:
		return modelservice.Response{}, fmt.Errorf("await model request %s: %w", id, modelservice.ErrClosed)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if e.ex.State != modelservice.StateAnswered || e.ex.Response == nil {
		return modelservice.Response{}, fmt.Errorf("await model request %s: %w (%s: %s)", id, modelservice.ErrGone, e.ex.State, e.ex.Reason)
	}
	return *e.ex.Response, nil
}

// Cancel ends request id without an answer.
func (b *Broker) Cancel(_ context.Context, id string, end modelservice.End) (modelservice.Response, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[id]
	switch {
	case e == nil:
		return modelservice.Response{}, fmt.Errorf("cancel model request %s: %w", id, modelservice.ErrNotFound)
	case e.ex.State == modelservice.StateAnswered:
		return *e.ex.Response, fmt.Errorf("cancel model request %s: %w", id, modelservice.ErrAnswered)
	case e.ex.State.Ended():
		return modelservice.Response{}, nil
	}
	b.dequeue(e)
	b.endLocked(e, end.State, end.Reason, b.cfg.Clock.Now())
	return modelservice.Response{}, nil
}

// Transcript returns a page of the lease's exchanges.
func (b *Broker) Transcript(_ context.Context, q modelservice.TranscriptQuery) ([]modelservice.Exchange, bool, error) {
	q = q.Normalized()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, false, fmt.Errorf("read transcript: %w", modelservice.ErrClosed)
	}
	now := b.cfg.Clock.Now()
	list := b.leases[q.LeaseID]
	i := sort.Search(len(list), func(i int) bool { return list[i].ex.ID > q.After })
	var (
		out   []modelservice.Exchange
		bytes int64
	)
	for ; i < len(list); i++ {
		e := list[i]
		if !b.retained(e, now) || (q.Owner != "" && e.ex.Owner != q.Owner) {
			continue
		}
		if len(out) >= q.Limit || !modelservice.WithinBytes(len(out), bytes, size(&e.ex), q.MaxBytes) {
			return out, true, nil
		}
		bytes += size(&e.ex)
		out = append(out, cloneExchange(e.ex))
	}
	return out, false, nil
}

// Purge deletes the exchanges whose retention has passed.
func (b *Broker) Purge(_ context.Context) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.cfg.Clock.Now()
	n := 0
	for lease, list := range b.leases {
		keep := list[:0]
		for _, e := range list {
			if b.retained(e, now) {
				keep = append(keep, e)
				continue
			}
			if !e.ex.State.Ended() {
				b.dequeue(e)
				b.endLocked(e, modelservice.StateExpired, "no answer within the request's timeout", now)
			}
			delete(b.entries, e.ex.ID)
			b.bytes -= size(&e.ex)
			n++
		}
		clear(list[len(keep):])
		if len(keep) == 0 {
			delete(b.leases, lease)
		} else {
			b.leases[lease] = keep
		}
	}
	return n, nil
}

// Close makes waiting and later calls return ErrClosed. Idempotent.
func (b *Broker) Close(context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.closed = true
		close(b.done)
	}
	return nil
}

func cloneRequest(r modelservice.Request) modelservice.Request {
	r.Body = slices.Clone(r.Body)
	r.Labels = maps.Clone(r.Labels)
	return r
}

func cloneExchange(ex modelservice.Exchange) modelservice.Exchange {
	ex.Request = cloneRequest(ex.Request)
	if ex.Response != nil {
		r := *ex.Response
		r.Body = slices.Clone(r.Body)
		ex.Response = &r
	}
	return ex
}
