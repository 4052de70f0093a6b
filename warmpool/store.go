package warmpool

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Sentinel errors of the lease store contract. Store implementations return
// them (possibly wrapped) and translate backend errors to them at the edge.
var (
	// ErrNotFound: no such lease or task.
	ErrNotFound = errors.New("not found")
	// ErrConflict: a conditional write lost a race (the version, state or
	// owner did not match). The caller re-reads and decides again.
	ErrConflict = errors.New("conflict: the record changed concurrently")
	// ErrNoCapacity: no ready task to claim, or the pool is at max_total.
	ErrNoCapacity = errors.New("no capacity")
	// ErrLeaseEnded: the lease was released, expired or lost.
	ErrLeaseEnded = errors.New("lease has ended")
	// ErrLeaseNotHeld: the lease belongs to another owner.
	ErrLeaseNotHeld = errors.New("lease not held by this owner")
	// ErrUnavailable: the store cannot be reached or throttled the call; the
	// operation did not happen and may be retried later.
	ErrUnavailable = errors.New("lease store unavailable")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("store closed")
	// ErrIdempotencyMismatch: an idempotency key was reused with a request
	// other than the one that made its lease (another pool, lease_seconds,
	// env or labels). Nothing was leased; the caller needs a new key.
	ErrIdempotencyMismatch = errors.New("the idempotency key was first used with a different request")
)

// TaskState is the warm pool's view of one task.
type TaskState string

const (
	// TaskLaunching: a slot is reserved and the provider was (or is about to
	// be) asked to launch. LaunchDeadline bounds how long it may stay so.
	TaskLaunching TaskState = "launching"
	// TaskReady: running and its agent answered /healthz; claimable.
	TaskReady TaskState = "ready"
	// TaskLeased: held by exactly one lease (LeaseID).
	TaskLeased TaskState = "leased"
	// TaskStopping: no longer usable; the reconciler stops it in the
	// provider and then deletes the record.
	TaskStopping TaskState = "stopping"
)

// Valid reports whether s is one of the four task states.
func (s TaskState) Valid() bool {
	switch s {
	case TaskLaunching, TaskReady, TaskLeased, TaskStopping:
		return true
	}
	return false
}

// TaskRecord is the store's record of one sandbox task. ID is Quarry's own
// task id (chosen before launch, so that launches in flight are counted);
// ProviderID is the provider's id once launched.
type TaskRecord struct {
	ID         string `json:"id"`
	Pool       string `json:"pool"`
	Provider   string `json:"provider"`
	ProviderID string `json:"provider_id,omitempty"`
	// Spec is the digest of the pool configuration the task was launched
	// for (PoolConfig.SpecDigest), set when it is reserved and never
	// changed: a pool hands out only tasks of its current digest, so a task
	// launched for an older configuration (another provider, image or
	// size) is never leased by the new one. Empty on records written before
	// digests were kept: those count as another configuration.
	Spec string `json:"spec,omitempty"`
	// Class is the pool class of an on-demand pool's task (its pool's
	// PoolRecord.Class), set when it is reserved (ReserveClassTasks) and
	// never changed; "" for a configured pool's. Stores count the task in
	// its class's total until it is deleted.
	Class          string    `json:"class,omitempty"`
	State          TaskState `json:"state"`
	AgentURL       string    `json:"agent_url,omitempty"`
	AgentToken     string    `json:"agent_token,omitempty"`
	LeaseID        string    `json:"lease_id,omitempty"`
	Generation     int64     `json:"generation"`
	Reason         string    `json:"reason,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
	LaunchDeadline time.Time `json:"launch_deadline,omitempty"`
	// Version increases by one on every write; conditional writes compare it.
	Version int64 `json:"version"`
}

// LeaseState is the lifecycle of a lease.
type LeaseState string

const (
	LeaseActive   LeaseState = "active"
	LeaseReleased LeaseState = "released" // ended by its owner
	LeaseExpired  LeaseState = "expired"  // not renewed before ExpiresAt
	LeaseLost     LeaseState = "lost"     // its task died or became unreachable
)

// Lease is one sandbox as a client sees it: a task held by one owner until
// ExpiresAt. It carries a copy of what is needed to reach the task's agent,
// so serving a request needs one lease read.
type Lease struct {
	ID         string     `json:"id"`
	Pool       string     `json:"pool"`
	TaskID     string     `json:"task_id"`
	Owner      string     `json:"owner"` // a hash of the API key, never the key
	State      LeaseState `json:"state"`
	Reason     string     `json:"reason,omitempty"`
	Generation int64      `json:"generation"`
	AgentURL   string     `json:"agent_url,omitempty"`
	AgentToken string     `json:"agent_token,omitempty"`
	// ProviderTaskID is the provider's id of the task (TaskRecord.ProviderID
	// when it was claimed), so that the task of an ended lease can be
	// stopped without reading its record.
	ProviderTaskID string `json:"provider_task_id,omitempty"`
	// Provider is the provider that made the task (TaskRecord.Provider when
	// it was claimed), which stops it when the lease ends, whatever the
	// pool's provider is by then. Empty on leases made before leases
	// carried it: their task's record says.
	Provider string `json:"provider,omitempty"`
	// Image is the image of the lease's pool when it was claimed (an
	// on-demand pool's, or a configured pool's), as the caller's Claim
	// gave it; stores keep it as given.
	Image  string            `json:"image,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// Env is what the acquire asked to set in the sandbox, given to its
	// agent's init. Stores keep it apart from the lease's record, which
	// every heartbeat rewrites: only Claim returns it; every read returns
	// the lease without it.
	Env            map[string]string `json:"env,omitempty"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	// RequestDigest, with an IdempotencyKey, is the digest of the request
	// that made the lease (AcquireRequest.Digest): a replay of the key with
	// another request is refused (ErrIdempotencyMismatch).
	RequestDigest string `json:"request_digest,omitempty"`
	// Duration is how far each heartbeat moves ExpiresAt.
	Duration  time.Duration `json:"duration"`
	CreatedAt time.Time     `json:"created_at"`
	ExpiresAt time.Time     `json:"expires_at"`
	EndedAt   time.Time     `json:"ended_at,omitempty"`
	// PausedAt is when the lease's sandbox was paused (Manager.Pause: its
	// task frozen by a provider that can); zero while it runs.
	PausedAt time.Time `json:"paused_at,omitempty"`
	Version  int64     `json:"version"`
}

// StateAt is the lease's state as clients see it at now: an active lease
// past ExpiresAt is expired, whether or not the reaper has ended it yet.
func (l Lease) StateAt(now time.Time) LeaseState {
	if l.State == LeaseActive && !now.Before(l.ExpiresAt) {
		return LeaseExpired
	}
	return l.State
}

// Ended returns nil while l can be used at now (active and unexpired), and
// otherwise a *LeaseEndedError saying how it ended.
func (l Lease) Ended(now time.Time) *LeaseEndedError {
	state := l.StateAt(now)
	if state == LeaseActive {
		return nil
	}
	return &LeaseEndedError{State: state, Reason: l.Reason}
}

// ReasonNotRenewed is the reason recorded with a lease that expired.
const ReasonNotRenewed = "its lease was not renewed before expires_at"

// LeaseEndedError says how a lease ended: its final state and the reason
// recorded with it. It matches ErrLeaseEnded (errors.Is).
type LeaseEndedError struct {
	State  LeaseState // LeaseReleased, LeaseExpired or LeaseLost
	Reason string
}

func (e *LeaseEndedError) Error() string {
	if e.Reason == "" {
		return "lease " + string(e.State)
	}
	return "lease " + string(e.State) + ": " + e.Reason
}

// Is makes a *LeaseEndedError match ErrLeaseEnded.
func (e *LeaseEndedError) Is(target error) bool { return target == ErrLeaseEnded }

// ClaimRequest asks the store to hand one task to a new lease.
type ClaimRequest struct {
	// Pool to claim a ready task from.
	Pool string
	// Spec, when set, is the pool's current configuration digest
	// (TaskRecord.Spec): only a task of that digest is claimed. A claim of
	// any ready task moves each ready task of another digest that it meets
	// to stopping (reason ReasonStaleSpec) and reports it in
	// ClaimResult.Stale, also when it then finds none to claim; a claim of
	// TaskID refuses a task of another digest with ErrConflict.
	Spec string
	// TaskID, when set, claims that task only (a cold start claims the task
	// it launched); it must be ready or launching, and in Pool.
	TaskID string
	// Lease is the lease to create. ID, Owner, Duration, ExpiresAt, Labels,
	// Env, IdempotencyKey and RequestDigest are taken from it; the store fills TaskID,
	// Generation, AgentURL, AgentToken, ProviderTaskID, State and Version
	// (ClaimedLease says how).
	Lease Lease
	Now   time.Time
}

// ClaimResult is the outcome of a successful Claim.
type ClaimResult struct {
	Lease Lease
	Task  TaskRecord
	// Replayed is true when Lease.IdempotencyKey had already been used by the
	// same owner: Lease is that earlier lease and nothing was claimed.
	Replayed bool
	// Stale are the ready tasks of another configuration digest than
	// ClaimRequest.Spec that the claim moved to stopping, as stored now
	// (the caller stops them in their provider). Claim returns them with
	// its error too: a claim that met only stale tasks returns them with
	// ErrNoCapacity.
	Stale []TaskRecord
}

// ReasonStaleSpec is the reason recorded with a ready task that a claim or
// the reconciler retired because it was launched for another configuration
// of its pool.
const ReasonStaleSpec = "it was launched for another configuration of its pool (provider, image, resources, env or options changed)"

// StaleScan is the most ready tasks of another configuration that one
// claim retires before it answers: a claim costs at most that many more
// records than it would, whatever the number of stale tasks.
const StaleScan = 16

// LeaseEnd describes how a lease ends.
type LeaseEnd struct {
	State  LeaseState // LeaseReleased, LeaseExpired or LeaseLost
	Reason string
	Now    time.Time
	// Owner, when set, must match the lease's owner (ErrLeaseNotHeld).
	Owner string
	// OnlyIfExpired makes the end conditional on ExpiresAt <= Now (the
	// reaper's guard against a heartbeat that just arrived).
	OnlyIfExpired bool
	// ForgetIdempotencyKey frees the lease's idempotency key, so that a
	// retry of the same acquire claims a new task instead of replaying this
	// lease. The manager sets it when a lease ends before its client could
	// use it (the agent's init failed). The lease keeps its IdempotencyKey
	// field; only the key's index entry goes.
	ForgetIdempotencyKey bool
	// Read, when set, is the lease as the caller last read it (any age). A
	// store may end the lease with a write conditional on Read.Version
	// instead of reading it first; a stale copy costs it a read, never a
	// wrong write.
	Read *Lease
}

// LeaseFilter selects leases in ListLeases. Zero fields match everything.
type LeaseFilter struct {
	Pool   string
	Owner  string
	State  LeaseState
	Labels map[string]string // every pair must match
	// ExpiresBefore selects active leases whose ExpiresAt is before it.
	ExpiresBefore time.Time
	Limit         int
}

// Matches reports whether l passes every set field of f (Limit aside), so
// that every store filters the same way.
func (f LeaseFilter) Matches(l Lease) bool {
	if f.Pool != "" && l.Pool != f.Pool || f.Owner != "" && l.Owner != f.Owner || f.State != "" && l.State != f.State {
		return false
	}
	if !f.ExpiresBefore.IsZero() && (l.State != LeaseActive || !l.ExpiresAt.Before(f.ExpiresBefore)) {
		return false
	}
	for k, v := range f.Labels {
		if got, ok := l.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Argument checks of the store contract. Every store calls the check of an
// operation before it reads or writes anything, so that all stores refuse
// the same arguments with the same message. The errors are plain (a caller
// passing them is a bug in Quarry, not bad input from a person), except a
// record id given twice to ReserveTasks, which wraps ErrConflict as an id
// that exists already does. A nil error says nothing about the stored
// state (capacity, versions, ownership): the store decides those.

// CheckReserve checks the arguments of ReserveTasks: pool is set, and every
// record has an id, names pool or no pool, and has an id of its own.
func CheckReserve(pool string, recs []TaskRecord) error { return checkReserve(pool, recs, false) }

// checkReserve is CheckReserve; classReserve allows records of a class
// (ReserveClassTasks).
func checkReserve(pool string, recs []TaskRecord, classReserve bool) error {
	if pool == "" {
		return errors.New("reserve tasks: pool is empty")
	}
	ids := make(map[string]bool, len(recs))
	for _, r := range recs {
		if r.ID == "" {
			return errors.New("reserve tasks: a record has an empty id")
		}
		if r.Pool != "" && r.Pool != pool {
			return fmt.Errorf("reserve tasks: record %s is for pool %q, not %q", r.ID, r.Pool, pool)
		}
		if ids[r.ID] {
			return fmt.Errorf("reserve tasks: id %s given twice: %w", r.ID, ErrConflict)
		}
		if r.Class != "" && !classReserve {
			return fmt.Errorf("reserve tasks: record %s is of class %q: reserve it with ReserveClassTasks", r.ID, r.Class)
		}
		ids[r.ID] = true
	}
	return nil
}

// CheckUpdate checks the arguments of UpdateTask: the record has an id and
// a valid state, and from is a valid state.
func CheckUpdate(rec TaskRecord, from TaskState) error {
	if rec.ID == "" {
		return errors.New("update task: id is empty")
	}
	if !rec.State.Valid() {
		return fmt.Errorf("update task %s: unknown state %q", rec.ID, rec.State)
	}
	if !from.Valid() {
		return fmt.Errorf("update task %s: unknown previous state %q", rec.ID, from)
	}
	return nil
}

// CheckDelete checks the record given to DeleteTask: it has an id and a
// pool.
func CheckDelete(rec TaskRecord) error {
	if rec.ID == "" || rec.Pool == "" {
		return fmt.Errorf("delete task %q: id and pool are required", rec.ID)
	}
	return nil
}

// CheckPage checks the arguments of ListTasksPage: limit is positive.
func CheckPage(limit int) error {
	if limit < 1 {
		return fmt.Errorf("list tasks page: limit %d; at least 1", limit)
	}
	return nil
}

// CheckClaim checks a ClaimRequest: Pool, Lease.ID, Lease.Owner and Now are
// set.
func CheckClaim(req ClaimRequest) error {
	switch {
	case req.Pool == "":
		return errors.New("claim: pool is empty")
	case req.Lease.ID == "":
		return errors.New("claim: lease id is empty")
	case req.Lease.Owner == "":
		return errors.New("claim: lease owner is empty")
	case req.Now.IsZero():
		return errors.New("claim: now is zero")
	}
	return nil
}

// CheckRenew checks the arguments of RenewLease: now is set.
func CheckRenew(now time.Time) error {
	if now.IsZero() {
		return errors.New("renew lease: now is zero")
	}
	return nil
}

// PausedConflict is PauseLease's error for a lease that already is as
// asked (paused, or running with paused false): a *PauseStateError, which
// is ErrConflict.
func PausedConflict(id string, paused bool) error {
	return &PauseStateError{ID: id, Paused: paused}
}

// PauseStateError: lease ID is paused already (Paused), or is not paused.
// It is ErrConflict, but not a race: retrying changes nothing.
type PauseStateError struct {
	ID     string
	Paused bool
}

func (e *PauseStateError) Error() string {
	if e.Paused {
		return fmt.Sprintf("lease %s is paused already", e.ID)
	}
	return fmt.Sprintf("lease %s is not paused", e.ID)
}

func (e *PauseStateError) Is(target error) bool { return target == ErrConflict }

// CheckEnd checks how EndLease is asked to end lease id: end.State is
// LeaseReleased, LeaseExpired or LeaseLost, and end.Now is set.
func CheckEnd(id string, end LeaseEnd) error {
	switch end.State {
	case LeaseReleased, LeaseExpired, LeaseLost:
	default:
		return fmt.Errorf("end lease %s: state %q is not released, expired or lost", id, end.State)
	}
	if end.Now.IsZero() {
		return errors.New("end lease: now is zero")
	}
	return nil
}

// CheckLock checks the arguments of TryLock: name and holder are set and
// ttl is positive.
func CheckLock(name, holder string, ttl time.Duration) error {
	if name == "" || holder == "" || ttl <= 0 {
		return fmt.Errorf("try lock %q: name, holder and a positive ttl are required", name)
	}
	return nil
}

// TaskCounts counts one pool's tasks by state.
type TaskCounts struct {
	Launching int `json:"launching"`
	Ready     int `json:"ready"`
	Leased    int `json:"leased"`
	Stopping  int `json:"stopping"`
}

// Total is the number of tasks counted: what max_total bounds.
func (c TaskCounts) Total() int { return c.Launching + c.Ready + c.Leased + c.Stopping }

// Add counts n more tasks in state (n may be negative); an unknown state
// is ignored.
func (c *TaskCounts) Add(state TaskState, n int) {
	switch state {
	case TaskLaunching:
		c.Launching += n
	case TaskReady:
		c.Ready += n
	case TaskLeased:
		c.Leased += n
	case TaskStopping:
		c.Stopping += n
	}
}

// CountStates counts recs by state (tests and audits compare it with
// CountTasks).
func CountStates(recs []TaskRecord) TaskCounts {
	var c TaskCounts
	for _, r := range recs {
		c.Add(r.State, 1)
	}
	return c
}

// TaskPage is one page of a walk over a pool's task records
// (ListTasksPage).
type TaskPage struct {
	Tasks []TaskRecord
	// Next is the cursor of the next page, "" after the last one.
	Next string
}

// TaskStore records the tasks of every pool. Implementations must be safe
// for concurrent use by many goroutines and many gateway replicas.
//
// Every write that changes a task's state changes the pool's counts
// (CountTasks) in the same atomic write, so the counts are right however
// writers race; a store never lists tasks to count them.
type TaskStore interface {
	// ReserveTasks creates the records (state launching) only if the pool's
	// task count plus len(recs) stays within maxTotal: all or none. It
	// returns ErrNoCapacity when the pool is full and ErrConflict when an id
	// exists already. Arguments CheckReserve refuses are refused with its
	// error, before anything is written; so are more records than the
	// store's ReserveLimiter allows.
	ReserveTasks(ctx context.Context, pool string, maxTotal int, recs []TaskRecord) error
	// UpdateTask writes rec if the stored record is at rec.Version and in
	// state from (the state the caller read: the store moves the counts
	// from it to rec.State), and returns the record as stored (Version
	// incremented). ErrConflict when the version or the state differs,
	// ErrNotFound when it does not exist; CheckUpdate's error for arguments
	// it refuses.
	UpdateTask(ctx context.Context, rec TaskRecord, from TaskState) (TaskRecord, error)
	// DeleteTask removes task rec.ID of pool rec.Pool and frees its slot in
	// the pool, whatever its state. rec.State is the state the caller last
	// saw: a store may rely on it to delete without reading first (a wrong
	// state costs it a read, never a wrong count). It is idempotent:
	// deleting an unknown id returns nil. CheckDelete's error for a record
	// it refuses.
	DeleteTask(ctx context.Context, rec TaskRecord) error
	// GetTask returns the record of task id, read consistently.
	// ErrNotFound when it does not exist.
	GetTask(ctx context.Context, id string) (TaskRecord, error)
	// CountTasks returns the pool's counts by state: one read of the
	// counters, whatever the number of tasks.
	CountTasks(ctx context.Context, pool string) (TaskCounts, error)
	// ListTasksPage returns at most limit records of the pool ("" for all
	// pools) after cursor (the Next of the previous page; "" starts a
	// walk), in an order of the store's. A walk sees every record that
	// exists from its start to its end once; one created or deleted during
	// the walk may be missed. Records may be read eventually consistently:
	// a caller decides with conditional writes. CheckPage's error for a
	// limit it refuses.
	ListTasksPage(ctx context.Context, pool, cursor string, limit int) (TaskPage, error)
	// ListTasks returns every task record of the pool ("" for all pools),
	// oldest first. It reads every record: for operators and tests; the
	// manager walks pages instead.
	ListTasks(ctx context.Context, pool string) ([]TaskRecord, error)
}

// ReserveLimiter is an optional TaskStore capability, discovered by type
// assertion: the most records one ReserveTasks call takes (DynamoDB: one
// transaction of at most 100 items holds the records and the counters they
// touch). The manager reserves in chunks within it. A store without it
// takes any number.
type ReserveLimiter interface {
	MaxReserve() int
}

// LeaseStore records leases. Every ownership decision is a conditional write.
type LeaseStore interface {
	// Claim atomically moves one ready task of the pool (or req.TaskID) to
	// leased, increments its generation and creates the lease. ErrNoCapacity
	// when there is no ready task. With an idempotency key that the owner has
	// used before, it returns that lease with Replayed set and claims nothing.
	// CheckClaim's error for a request it refuses.
	Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error)
	// GetLease returns a lease in any state. ErrNotFound when unknown (or
	// purged after its retention).
	GetLease(ctx context.Context, id string) (Lease, error)
	// RenewLease moves an active, unexpired lease's ExpiresAt to expiresAt,
	// or, when expiresAt is zero, to now plus the lease's own Duration (one
	// conditional write, no read: a heartbeat). ErrLeaseEnded when it ended
	// or expired (ExpiresAt <= now), ErrLeaseNotHeld when owner differs,
	// ErrNotFound when unknown; an error for a zero expiresAt on a lease
	// without a Duration; CheckRenew's error when it refuses now.
	RenewLease(ctx context.Context, id, owner string, expiresAt, now time.Time) (Lease, error)
	// PauseLease marks an active, unexpired lease paused (PausedAt = now)
	// or, with paused false, running again (PausedAt cleared), in one
	// conditional write. ErrConflict when it already is so; otherwise the
	// errors of RenewLease.
	PauseLease(ctx context.Context, id, owner string, paused bool, now time.Time) (Lease, error)
	// EndLease ends an active lease and moves its task to stopping, in one
	// atomic write. Ending an already-ended lease returns it with ErrLeaseEnded.
	// CheckEnd's error for an end it refuses.
	EndLease(ctx context.Context, id string, end LeaseEnd) (Lease, error)
	// ListLeases returns the leases f matches (LeaseFilter.Matches), newest
	// first, at most f.Limit of them when it is set.
	ListLeases(ctx context.Context, f LeaseFilter) ([]Lease, error)
	// LeaseByKey returns, in any state, the lease that owner's idempotency
	// key names (the lease its last successful Claim with the key made,
	// unless that lease's key was forgotten since). ErrNotFound when the key
	// names none. It reads the key and the lease: no listing.
	LeaseByKey(ctx context.Context, owner, key string) (Lease, error)
	// PurgeLeases deletes leases that ended before endedBefore and returns
	// how many it deleted.
	PurgeLeases(ctx context.Context, endedBefore time.Time) (int, error)
}

// ClaimedLease returns what a successful Claim of task writes: the lease
// (req.Lease with Pool, TaskID, Generation, AgentURL, AgentToken,
// ProviderTaskID and Provider taken from the task, state active, Reason and
// EndedAt cleared, Version 1, CreatedAt req.Now when it is zero) and the
// task (leased by the lease, Generation and Version incremented, Reason
// cleared, UpdatedAt req.Now). It is pure: it checks nothing and writes
// nothing. Every store calls it for the records it writes, so that all
// stores fill a claim alike; the store decides whether the claim may
// happen (task ready or launching, at the version it read).
func ClaimedLease(req ClaimRequest, task TaskRecord) (Lease, TaskRecord) {
	task.State = TaskLeased
	task.LeaseID = req.Lease.ID
	task.Generation++
	task.Version++
	task.Reason = ""
	task.UpdatedAt = req.Now

	l := req.Lease
	l.Pool = req.Pool
	l.TaskID = task.ID
	l.Generation = task.Generation
	l.AgentURL = task.AgentURL
	l.AgentToken = task.AgentToken
	l.ProviderTaskID = task.ProviderID
	l.Provider = task.Provider
	l.State = LeaseActive
	l.Reason = ""
	l.EndedAt = time.Time{}
	l.Version = 1
	if l.CreatedAt.IsZero() {
		l.CreatedAt = req.Now
	}
	return l, task
}

// Locker holds named locks as expiring leases in the store, so that work
// that must run on one replica at a time (a pool's reconciler) moves to
// another replica when the holder dies: its lock simply expires.
type Locker interface {
	// TryLock takes the lock name for holder until now+ttl, or extends it if
	// holder holds it already. It returns true when holder holds the lock
	// afterwards and false (with a nil error) while another holder's lock
	// has not expired. The decision is one conditional write. CheckLock's
	// error for arguments it refuses.
	TryLock(ctx context.Context, name, holder string, ttl time.Duration, now time.Time) (bool, error)
	// Unlock releases the lock if holder holds it. It is idempotent.
	Unlock(ctx context.Context, name, holder string) error
}

// PoolState is the lifecycle of an on-demand pool's record.
type PoolState string

const (
	// PoolActive: the pool serves acquires; its tasks may be reserved.
	PoolActive PoolState = "active"
	// PoolEnded: the pool was idle and had no task when it ended; no task
	// can be reserved for it until it is active again (UpdatePool). The
	// record keeps what the provider made for its image until it is
	// deleted.
	PoolEnded PoolState = "ended"
)

// Valid reports whether s is one of the two pool states.
func (s PoolState) Valid() bool { return s == PoolActive || s == PoolEnded }

// PoolRecord is the store's record of one on-demand pool: a pool made for
// an image that a request named, of a class the operator configured. Its
// name is derived from what defines it (OnDemandPoolName), so every
// replica names it alike.
type PoolRecord struct {
	Name  string `json:"name"`
	Class string `json:"class"`
	// Image is the normalized reference asked for; CPU, MemoryMiB and
	// DiskMiB the resources (the class's defaults where the request named
	// none).
	Image     string  `json:"image"`
	CPU       float64 `json:"cpu"`
	MemoryMiB int     `json:"memory_mib"`
	DiskMiB   int     `json:"disk_mib,omitempty"`
	// Digest is the image's content digest, and Ref the provider's handle
	// on what it made for the image (providers.ImageInfo), when known.
	Digest string    `json:"digest,omitempty"`
	Ref    string    `json:"ref,omitempty"`
	State  PoolState `json:"state"`
	// LastUsed is the latest acquire counted (TouchPool) or the pool's
	// (re)activation; Acquires counts acquires since the record was made.
	CreatedAt time.Time `json:"created_at"`
	LastUsed  time.Time `json:"last_used"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	Acquires  int64     `json:"acquires"`
	// WarmFloor ready tasks are kept until WarmUntil (a prefetch's warm).
	WarmFloor int       `json:"warm_floor,omitempty"`
	WarmUntil time.Time `json:"warm_until,omitzero"`
	// Version increases by one on every write but TouchPool's;
	// conditional writes compare it.
	Version int64 `json:"version"`
}

// PoolPage is one page of a walk over pool records (ListPoolsPage).
type PoolPage struct {
	Pools []PoolRecord
	// Next is the cursor of the next page, "" after the last one.
	Next string
}

// PoolStore records on-demand pools, and reserves their tasks within their
// class's total. Every replica shares them through the store.
type PoolStore interface {
	// CreatePool writes rec (state active, version 1) if no record of its
	// name exists, and returns it as stored; ErrConflict when one exists.
	// CheckPool's error for a record it refuses.
	CreatePool(ctx context.Context, rec PoolRecord) (PoolRecord, error)
	// UpdatePool writes rec if the stored record is at rec.Version, and
	// returns it as stored (Version incremented): ErrConflict when the
	// version differs, ErrNotFound when there is none. Its name and class
	// never change, and it cannot end a pool (EndPool does); it may make an
	// ended pool active again. Acquires stay as stored (TouchPool counts
	// them) and LastUsed becomes the later of the stored one and rec's.
	// CheckPool's error for a record it refuses.
	UpdatePool(ctx context.Context, rec PoolRecord) (PoolRecord, error)
	// TouchPool counts n more acquires of pool name at at: Acquires += n,
	// LastUsed = max(LastUsed, at), in one unconditional write that reads
	// nothing and leaves Version alone. ErrNotFound when there is no
	// record.
	TouchPool(ctx context.Context, name string, at time.Time, n int) error
	// EndPool moves an active pool to ended (EndedAt = now) if its record
	// is at rec.Version and no task of the pool is counted, in one atomic
	// write, and returns it as stored: ErrConflict when the version, the
	// state or the tasks say otherwise.
	EndPool(ctx context.Context, rec PoolRecord, now time.Time) (PoolRecord, error)
	// DeletePool removes an ended pool's record at rec.Version;
	// ErrConflict when it changed or is active. Deleting an unknown name
	// returns nil.
	DeletePool(ctx context.Context, rec PoolRecord) error
	// GetPool returns pool name's record, read consistently; ErrNotFound
	// when there is none.
	GetPool(ctx context.Context, name string) (PoolRecord, error)
	// ListPoolsPage returns at most limit pool records of the class ("" for
	// every class) after cursor, in an order of the store's, with the
	// guarantees of ListTasksPage. CheckPage's error for a limit it
	// refuses.
	ListPoolsPage(ctx context.Context, class, cursor string, limit int) (PoolPage, error)
	// ReserveClassTasks is ReserveTasks for an on-demand pool of class: it
	// creates the records (their Class set to class) only if the pool's
	// record is active, the pool's tasks stay within maxTotal and the
	// class's (every pool of it together) within classMax: all or none,
	// decided in one atomic write. ErrNoCapacity when a limit is reached
	// or the pool's record is not active, ErrConflict when an id exists;
	// CheckReserve's error for arguments it refuses. DeleteTask uncounts a
	// task of a class from its class too.
	ReserveClassTasks(ctx context.Context, class string, classMax int, pool string, maxTotal int, recs []TaskRecord) error
	// CountClass returns how many tasks of the class's pools exist (what
	// classMax bounds): one read of its counters.
	CountClass(ctx context.Context, class string) (int, error)
}

// CheckPool checks a pool record given to CreatePool or UpdatePool: name,
// class and image are set, and its state is valid (CreatePool's record
// may leave it empty: active).
func CheckPool(rec PoolRecord) error {
	switch {
	case rec.Name == "" || rec.Class == "" || rec.Image == "":
		return fmt.Errorf("pool record %q: name, class and image are required", rec.Name)
	case rec.State != "" && !rec.State.Valid():
		return fmt.Errorf("pool record %s: unknown state %q", rec.Name, rec.State)
	}
	return nil
}

// CheckReserveClass checks the arguments of ReserveClassTasks: those of
// CheckReserve, a class and its positive total, and records that name no
// class or this one.
func CheckReserveClass(class string, classMax int, pool string, recs []TaskRecord) error {
	if err := checkReserve(pool, recs, true); err != nil {
		return err
	}
	if class == "" || classMax < 1 {
		return fmt.Errorf("reserve tasks of pool %s: class %q with max %d: a class and a positive total are required", pool, class, classMax)
	}
	for _, r := range recs {
		if r.Class != "" && r.Class != class {
			return fmt.Errorf("reserve tasks: record %s is of class %q, not %q", r.ID, r.Class, class)
		}
	}
	return nil
}

// Store is the lease store: tasks and leases. The embedded store
// (warmpool/boltstore) is the single-node default; warmpool/storetest is the
// conformance suite every implementation passes.
type Store interface {
	TaskStore
	LeaseStore
	PoolStore
	Locker
	// Close releases the store's resources. It is safe to call once.
	Close() error
}
