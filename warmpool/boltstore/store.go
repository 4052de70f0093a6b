package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/quarryhq/quarry/warmpool"
)

// schemaVersion is written to the meta bucket; Open refuses other versions.
const schemaVersion = "1"

// purgeBatch bounds how many leases one PurgeLeases transaction deletes, so
// that a large purge does not hold the write lock for long.
const purgeBatch = 1000

// Bucket names.
var (
	bucketMeta       = []byte("meta")
	bucketTasks      = []byte("tasks")         // task id → TaskRecord JSON
	bucketTasksPool  = []byte("tasks_by_pool") // lp(pool) id → ""
	bucketTasksReady = []byte("tasks_ready")   // lp(pool) created id → id
	bucketLeases     = []byte("leases")        // lease id → Lease JSON
	bucketOwner      = []byte("leases_owner")  // lp(owner) created id → ""
	bucketExpiry     = []byte("leases_expiry") // expires id → "" (active leases only)
	bucketEnded      = []byte("leases_ended")  // ended id → "" (ended leases only)
	bucketIdem       = []byte("leases_idem")   // lp(owner) key → lease id
	bucketEnv        = []byte("leases_env")    // lease id → env JSON (kept apart from the lease)
	bucketLocks      = []byte("locks")         // lock name → lockRecord JSON
	bucketCounts     = []byte("task_counts")   // lp(pool) state → uint64: the pool's tasks in that state
	allBuckets       = [][]byte{bucketMeta, bucketTasks, bucketTasksPool, bucketTasksReady,
		bucketLeases, bucketOwner, bucketExpiry, bucketEnded, bucketIdem, bucketLocks, bucketCounts, bucketEnv,
		bucketPools, bucketPoolsClass, bucketClassCounts}
	keySchema = []byte("schema")
	// keyCounted marks a file whose task_counts bucket counts its tasks (a
	// file made before the counters is counted once, when it opens).
	keyCounted = []byte("counted")
)

// Options tune Open. The zero value is the durable default.
type Options struct {
	// Timeout bounds waiting for the file lock when another process holds
	// the file open (default 5 s).
	Timeout time.Duration
	// NoSync skips fsync on commit. Faster, but a machine crash may lose the
	// latest writes: never for a gateway, only for throwaway stores.
	NoSync bool
}

// Store is the embedded lease store. It is safe for concurrent use. Reads
// run concurrently; writes queue for one writer goroutine, which runs all
// the writes waiting at once in one transaction (group commit: one commit,
// and its two fsyncs, for the group).
type Store struct {
	db     *bolt.DB
	closed atomic.Bool

	// wmu guards sending on writes against Close, which closes it.
	wmu     sync.RWMutex
	wclosed bool
	writes  chan *writeOp
	writer  sync.WaitGroup
}

// maxGroup bounds the writes of one group commit.
const maxGroup = 1000

// writeOp is one write waiting for the writer.
type writeOp struct {
	ctx    context.Context
	action string
	fn     func(*tx) error
	done   chan error // buffered 1: the write's outcome (fn's error, or the commit's)
}

var _ warmpool.Store = (*Store)(nil)

// Open opens (creating it and its directory when missing) the store file at
// path. It fails when another process holds the file for longer than
// opts.Timeout, or when the file was written by an incompatible version.
func Open(path string, opts Options) (*Store, error) {
	if path == "" {
		return nil, errors.New("open lease store: path is empty")
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create lease store directory: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout: opts.Timeout,
		NoSync:  opts.NoSync,
		// The free list is rebuilt on open instead of written on every
		// commit (one page less per write; durability is unchanged), and kept
		// in a hash map, which stays fast as the file grows.
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
		// Map 64 MiB up front (address space only) so that growing the file
		// rarely remaps it, which would block every reader.
		InitialMmapSize: 64 << 20,
	})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("open lease store %s: another process holds it (waited %s): %w", path, opts.Timeout, err)
		}
		return nil, fmt.Errorf("open lease store %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return fmt.Errorf("create bucket %s: %w", name, err)
			}
		}
		meta := tx.Bucket(bucketMeta)
		switch v := meta.Get(keySchema); {
		case v == nil:
			if err := meta.Put(keySchema, []byte(schemaVersion)); err != nil {
				return err
			}
		case string(v) != schemaVersion:
			return fmt.Errorf("schema version %q, this build reads %q", v, schemaVersion)
		}
		if meta.Get(keyCounted) == nil {
			if err := recount(openTx(tx)); err != nil {
				return fmt.Errorf("count tasks: %w", err)
			}
			return meta.Put(keyCounted, []byte("1"))
		}
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("initialize lease store %s: %w", path, err)
	}
	s := &Store{db: db, writes: make(chan *writeOp, maxGroup)}
	s.writer.Add(1)
	go s.write()
	return s, nil
}

// Close closes the file. Later calls return warmpool.ErrClosed; closing
// twice returns nil.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.wmu.Lock()
	s.wclosed = true
	close(s.writes) // the writer commits what was queued, then ends
	s.wmu.Unlock()
	s.writer.Wait()
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close lease store: %w", err)
	}
	return nil
}

// ReserveTasks implements warmpool.TaskStore: all or none, within maxTotal.
func (s *Store) ReserveTasks(ctx context.Context, pool string, maxTotal int, recs []warmpool.TaskRecord) error {
	if err := warmpool.CheckReserve(pool, recs); err != nil {
		return err
	}
	if len(recs) == 0 {
		return nil
	}
	return s.update(ctx, "reserve tasks", func(t *tx) error { return t.reserve(pool, maxTotal, recs) })
}

// reserve creates recs (launching, version 1) in pool if its tasks stay
// within maxTotal: every refusal before the first write.
func (t *tx) reserve(pool string, maxTotal int, recs []warmpool.TaskRecord) error {
	n := t.counts(pool).Total()
	if n+len(recs) > maxTotal {
		return fmt.Errorf("pool %q has %d of max_total %d tasks, %d more do not fit: %w", pool, n, maxTotal, len(recs), warmpool.ErrNoCapacity)
	}
	for _, r := range recs {
		if t.tasks.Get([]byte(r.ID)) != nil {
			return fmt.Errorf("task %s exists already: %w", r.ID, warmpool.ErrConflict)
		}
	}
	for _, r := range recs {
		r.Pool = pool
		r.State = warmpool.TaskLaunching
		r.Version = 1
		if err := t.putTask(nil, r); err != nil {
			return err
		}
	}
	return nil
}

// UpdateTask implements warmpool.TaskStore: a write conditional on Version
// and on the previous state.
func (s *Store) UpdateTask(ctx context.Context, rec warmpool.TaskRecord, from warmpool.TaskState) (warmpool.TaskRecord, error) {
	if err := warmpool.CheckUpdate(rec, from); err != nil {
		return warmpool.TaskRecord{}, err
	}
	var out warmpool.TaskRecord
	err := s.update(ctx, "update task", func(t *tx) error {
		old, ok, err := t.getTask(rec.ID)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("task %s: %w", rec.ID, warmpool.ErrNotFound)
		}
		if old.Version != rec.Version {
			return fmt.Errorf("task %s is at version %d, not %d: %w", rec.ID, old.Version, rec.Version, warmpool.ErrConflict)
		}
		if old.State != from {
			return fmt.Errorf("task %s is %s, not %s: %w", rec.ID, old.State, from, warmpool.ErrConflict)
		}
		if rec.Pool != old.Pool {
			return fmt.Errorf("task %s: pool cannot change from %q to %q", rec.ID, old.Pool, rec.Pool)
		}
		out = rec
		out.Spec, out.Class = old.Spec, old.Class // set at reserve, never changed
		out.Version++
		return t.putTask(&old, out)
	})
	if err != nil {
		return warmpool.TaskRecord{}, err
	}
	return out, nil
}

// DeleteTask implements warmpool.TaskStore; deleting an unknown id is a
// no-op. The record is read in the transaction: rec.State is not needed.
func (s *Store) DeleteTask(ctx context.Context, rec warmpool.TaskRecord) error {
	if err := warmpool.CheckDelete(rec); err != nil {
		return err
	}
	return s.update(ctx, "delete task", func(t *tx) error {
		stored, ok, err := t.getTask(rec.ID)
		if err != nil || !ok {
			return err
		}
		return t.deleteTask(stored)
	})
}

// GetTask implements warmpool.TaskStore.
func (s *Store) GetTask(ctx context.Context, id string) (warmpool.TaskRecord, error) {
	return getOne(s, ctx, "get task", "task", id, (*tx).getTask)
}

// getOne reads record id with get in one read transaction; ErrNotFound
// when there is none.
func getOne[T any](s *Store, ctx context.Context, action, kind, id string, get func(*tx, string) (T, bool, error)) (T, error) {
	var rec T
	err := s.view(ctx, action, func(t *tx) error {
		var ok bool
		var err error
		rec, ok, err = get(t, id)
		if err == nil && !ok {
			err = fmt.Errorf("%s %s: %w", kind, id, warmpool.ErrNotFound)
		}
		return err
	})
	return rec, err
}

// CountTasks implements warmpool.TaskStore: four counter reads.
func (s *Store) CountTasks(ctx context.Context, pool string) (warmpool.TaskCounts, error) {
	var c warmpool.TaskCounts
	err := s.view(ctx, "count tasks", func(t *tx) error {
		c = t.counts(pool)
		return nil
	})
	return c, err
}

// ListTasksPage implements warmpool.TaskStore, in id order; the cursor is
// the last id of the page.
func (s *Store) ListTasksPage(ctx context.Context, pool, cursor string, limit int) (warmpool.TaskPage, error) {
	if err := warmpool.CheckPage(limit); err != nil {
		return warmpool.TaskPage{}, err
	}
	var page warmpool.TaskPage
	err := s.view(ctx, "list tasks page", func(t *tx) error {
		b, prefix := t.tasks, []byte(nil)
		if pool != "" {
			b, prefix = t.tasksPool, lp(pool)
		}
		var err error
		page.Tasks, page.Next, err = walkPage(b, prefix, cursor, limit, "pool index names missing task", t.getTask)
		return err
	})
	return page, err
}

// walkPage reads at most limit records after cursor, in key order, of the
// keys of b with prefix (an index: the record's id follows the prefix; or
// the records' own bucket, prefix nil), and returns them with the cursor of
// the next page (the last id, "" after the last page). missing is the
// error of an index key whose record get does not find.
func walkPage[T any](b *bolt.Bucket, prefix []byte, cursor string, limit int, missing string, get func(string) (T, bool, error)) ([]T, string, error) {
	var out []T
	after := concat(prefix, []byte(cursor))
	c := b.Cursor()
	k, _ := c.Seek(after)
	if k != nil && cursor != "" && bytes.Equal(k, after) {
		k, _ = c.Next()
	}
	last := ""
	for ; k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		if len(out) == limit {
			return out, last, nil
		}
		id := string(k[len(prefix):])
		rec, ok, err := get(id)
		if err != nil {
			return nil, "", err
		}
		if !ok {
			return nil, "", fmt.Errorf("%s %s", missing, id)
		}
		out, last = append(out, rec), id
	}
	return out, "", nil
}

// ListTasks implements warmpool.TaskStore, oldest first.
func (s *Store) ListTasks(ctx context.Context, pool string) ([]warmpool.TaskRecord, error) {
	var out []warmpool.TaskRecord
	err := s.view(ctx, "list tasks", func(t *tx) error {
		add := func(v []byte) error {
			var rec warmpool.TaskRecord
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("decode task: %w", err)
			}
			out = append(out, rec)
			return nil
		}
		if pool == "" {
			return t.tasks.ForEach(func(_, v []byte) error { return add(v) })
		}
		prefix := lp(pool)
		c := t.tasksPool.Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			v := t.tasks.Get(k[len(prefix):])
			if v == nil {
				return fmt.Errorf("pool index names missing task %s", k[len(prefix):])
			}
			if err := add(v); err != nil {
				return err
			}
		}
		return nil
	})
	slices.SortFunc(out, func(a, b warmpool.TaskRecord) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, err
}

// Claim implements warmpool.LeaseStore: the oldest ready task of the pool
// (or req.TaskID) becomes leased and the lease is created, in one
// transaction.
func (s *Store) Claim(ctx context.Context, req warmpool.ClaimRequest) (warmpool.ClaimResult, error) {
	if err := warmpool.CheckClaim(req); err != nil {
		return warmpool.ClaimResult{}, err
	}
	var res warmpool.ClaimResult
	var none bool // no task of req.Spec was ready
	err := s.update(ctx, "claim", func(t *tx) error {
		res, none = warmpool.ClaimResult{}, false // fn may run again
		if key := req.Lease.IdempotencyKey; key != "" {
			if id := t.idem.Get(idemKey(req.Lease.Owner, key)); id != nil {
				l, ok, err := t.getLease(string(id))
				if err != nil {
					return err
				}
				if ok {
					res = warmpool.ClaimResult{Lease: l, Replayed: true}
					if task, ok, err := t.getTask(l.TaskID); err == nil && ok {
						res.Task = task
					}
					return nil
				}
			}
		}
		if t.leases.Get([]byte(req.Lease.ID)) != nil {
			return fmt.Errorf("lease %s exists already: %w", req.Lease.ID, warmpool.ErrConflict)
		}
		task, stale, err := t.claimable(req)
		if err != nil {
			return err
		}
		if task.ID == "" { // only stale tasks (now stopping): that write commits
			res, none = warmpool.ClaimResult{Stale: stale}, true
			return nil
		}
		old := task
		l, task := warmpool.ClaimedLease(req, task)
		if err := t.putTask(&old, task); err != nil {
			return err
		}
		if err := t.putLease(nil, l); err != nil {
			return err
		}
		if len(l.Env) > 0 {
			env, err := json.Marshal(l.Env)
			if err != nil {
				return fmt.Errorf("encode the env of lease %s: %w", l.ID, err)
			}
			if err := t.env.Put([]byte(l.ID), env); err != nil {
				return err
			}
		}
		res = warmpool.ClaimResult{Lease: l, Task: task, Stale: stale}
		return nil
	})
	switch {
	case err != nil:
		return warmpool.ClaimResult{}, err
	case none:
		return res, fmt.Errorf("claim: pool %q has no ready task of its configuration (%d of another retired): %w", req.Pool, len(res.Stale), warmpool.ErrNoCapacity)
	}
	return res, nil
}

// GetLease implements warmpool.LeaseStore.
func (s *Store) GetLease(ctx context.Context, id string) (warmpool.Lease, error) {
	return getOne(s, ctx, "get lease", "lease", id, (*tx).getLease)
}

// RenewLease implements warmpool.LeaseStore. On ErrLeaseEnded it also
// returns the lease as stored.
func (s *Store) RenewLease(ctx context.Context, id, owner string, expiresAt, now time.Time) (warmpool.Lease, error) {
	if err := warmpool.CheckRenew(now); err != nil {
		return warmpool.Lease{}, err
	}
	return s.changeLease(ctx, "renew lease", id, owner, func(_ *tx, l warmpool.Lease) (warmpool.Lease, error) {
		if !l.ExpiresAt.After(now) {
			return l, fmt.Errorf("lease %s expired at %s: %w", id, l.ExpiresAt.Format(time.RFC3339), warmpool.ErrLeaseEnded)
		}
		switch {
		case !expiresAt.IsZero():
			l.ExpiresAt = expiresAt
		case l.Duration > 0:
			l.ExpiresAt = now.Add(l.Duration)
		default:
			return warmpool.Lease{}, fmt.Errorf("renew lease %s: it has no duration to renew it by", id)
		}
		return l, nil
	})
}

// EndLease implements warmpool.LeaseStore: the lease ends and its task
// becomes stopping in one transaction. On ErrLeaseEnded it returns the
// lease as stored.
func (s *Store) EndLease(ctx context.Context, id string, end warmpool.LeaseEnd) (warmpool.Lease, error) {
	if err := warmpool.CheckEnd(id, end); err != nil {
		return warmpool.Lease{}, err
	}
	return s.changeLease(ctx, "end lease", id, end.Owner, func(t *tx, l warmpool.Lease) (warmpool.Lease, error) {
		if end.OnlyIfExpired && l.ExpiresAt.After(end.Now) {
			return l, fmt.Errorf("lease %s was renewed until %s: %w", id, l.ExpiresAt.Format(time.RFC3339Nano), warmpool.ErrConflict)
		}
		l.State = end.State
		l.Reason = end.Reason
		l.EndedAt = end.Now
		if end.ForgetIdempotencyKey {
			t.forgetIdem(l)
		}
		task, ok, err := t.getTask(l.TaskID)
		if err != nil || !ok || task.State != warmpool.TaskLeased || task.LeaseID != l.ID {
			return l, err
		}
		oldTask := task
		task.State = warmpool.TaskStopping
		task.Reason = "lease " + string(end.State)
		if end.Reason != "" {
			task.Reason += ": " + end.Reason
		}
		task.UpdatedAt = end.Now
		task.Version++
		return l, t.putTask(&oldTask, task)
	})
}

// changeLease applies change to the active lease id (of owner, when set)
// and writes the result with its version incremented, in one transaction.
// A lease that is not active, or a change failing with ErrLeaseEnded,
// returns the lease as stored with ErrLeaseEnded.
func (s *Store) changeLease(ctx context.Context, action, id, owner string, change func(*tx, warmpool.Lease) (warmpool.Lease, error)) (warmpool.Lease, error) {
	var out warmpool.Lease
	err := s.update(ctx, action, func(t *tx) error {
		l, err := t.mustLease(id, owner)
		if err != nil {
			return err
		}
		if l.State != warmpool.LeaseActive {
			out = l
			return fmt.Errorf("lease %s is %s: %w", id, l.State, warmpool.ErrLeaseEnded)
		}
		changed, err := change(t, l)
		if err != nil {
			out = l
			return err
		}
		changed.Version = l.Version + 1
		if err := t.putLease(&l, changed); err != nil {
			return err
		}
		out = changed
		return nil
	})
	if err != nil && !errors.Is(err, warmpool.ErrLeaseEnded) {
		return warmpool.Lease{}, err
	}
	return out, err
}

// LeaseByKey implements warmpool.LeaseStore: the key's index entry, then
// the lease, in one read transaction.
func (s *Store) LeaseByKey(ctx context.Context, owner, key string) (warmpool.Lease, error) {
	var l warmpool.Lease
	err := s.view(ctx, "lease by key", func(t *tx) error {
		id := t.idem.Get(idemKey(owner, key))
		if id == nil {
			return fmt.Errorf("idempotency key %q: %w", key, warmpool.ErrNotFound)
		}
		var ok bool
		var err error
		l, ok, err = t.getLease(string(id))
		if err == nil && !ok {
			err = fmt.Errorf("lease %s of idempotency key %q: %w", id, key, warmpool.ErrNotFound)
		}
		return err
	})
	return l, err
}

// ListLeases implements warmpool.LeaseStore, newest first. With Owner it
// reads the owner index (the gateway's lists), with ExpiresBefore the
// expiry index (the reaper), otherwise every lease: no creation index is
// kept, to spare each claim a page write.
func (s *Store) ListLeases(ctx context.Context, f warmpool.LeaseFilter) ([]warmpool.Lease, error) {
	var out []warmpool.Lease
	err := s.view(ctx, "list leases", func(t *tx) error {
		visit := func(id []byte) (bool, error) {
			l, ok, err := t.getLease(string(id))
			if err != nil || !ok {
				return err == nil, err
			}
			if f.Matches(l) {
				out = append(out, l)
			}
			return f.Limit <= 0 || len(out) < f.Limit, nil
		}
		if f.Owner != "" {
			prefix := lp(f.Owner)
			return reverseScan(t.owner.Cursor(), prefix, func(k []byte) (bool, error) {
				return visit(k[len(prefix)+8:])
			})
		}
		// Without an owner: the active leases expiring before a time (the
		// reaper) from the expiry index, or every lease (rare: operators);
		// then newest first.
		limit := f.Limit
		f.Limit = 0
		if !f.ExpiresBefore.IsZero() {
			bound := tsKey(f.ExpiresBefore)
			c := t.expiry.Cursor()
			for k, _ := c.First(); k != nil && bytes.Compare(k[:8], bound) < 0; k, _ = c.Next() {
				if _, err := visit(k[8:]); err != nil {
					return err
				}
			}
		} else if err := t.leases.ForEach(func(id, _ []byte) error { _, err := visit(id); return err }); err != nil {
			return err
		}
		sortNewestFirst(out)
		if limit > 0 && len(out) > limit {
			out = out[:limit]
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// PurgeLeases implements warmpool.LeaseStore, in transactions of at most
// purgeBatch leases.
func (s *Store) PurgeLeases(ctx context.Context, endedBefore time.Time) (int, error) {
	bound := tsKey(endedBefore)
	total := 0
	for more := true; more; {
		n := 0
		err := s.update(ctx, "purge leases", func(t *tx) error {
			n = 0
			var keys [][]byte
			c := t.ended.Cursor()
			for k, _ := c.First(); k != nil && bytes.Compare(k[:8], bound) < 0 && len(keys) < purgeBatch; k, _ = c.Next() {
				keys = append(keys, bytes.Clone(k))
			}
			more = len(keys) == purgeBatch
			for _, k := range keys {
				l, ok, err := t.getLease(string(k[8:]))
				if err != nil {
					return err
				}
				if !ok { // an index entry without its lease: drop it
					if err := t.ended.Delete(k); err != nil {
						return err
					}
					continue
				}
				if err := t.deleteLease(l); err != nil {
					return err
				}
				n++
			}
			return nil
		})
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

// update runs fn in a read-write transaction, with the other writes that
// wait for the writer at the same time (write). Errors returned by fn are
// wrapped with action; errors of bbolt itself (I/O, commit) also wrap
// warmpool.ErrUnavailable: the write did not happen.
//
// fn must decide every refusal (an error wrapping one of the contract's
// sentinels, below) before it writes anything, so that a refused write
// leaves its group alone; any other error rolls the group back. fn may run
// more than once (a group that rolled back runs its writes again one by
// one), so it must set what it reports on every run.
func (s *Store) update(ctx context.Context, action string, fn func(*tx) error) error {
	if s.closed.Load() {
		return fmt.Errorf("%s: %w", action, warmpool.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", action, err)
	}
	op := &writeOp{ctx: ctx, action: action, fn: fn, done: make(chan error, 1)}
	s.wmu.RLock()
	if s.wclosed {
		s.wmu.RUnlock()
		return fmt.Errorf("%s: %w", action, warmpool.ErrClosed)
	}
	s.writes <- op
	s.wmu.RUnlock()
	// The commit is bounded (local I/O); the caller waits for it whatever
	// its ctx, as it would for bbolt's own Update: a write its caller gave
	// up on must not be reported as not done.
	return <-op.done
}

// write is the writer goroutine: it takes every write waiting (at most
// maxGroup) and commits them together, until Close closes the queue.
func (s *Store) write() {
	defer s.writer.Done()
	group := make([]*writeOp, 0, maxGroup)
	for op := range s.writes {
		group = append(group[:0], op)
	drain:
		for len(group) < maxGroup {
			select {
			case op, ok := <-s.writes:
				if !ok {
					break drain
				}
				group = append(group, op)
			default:
				break drain
			}
		}
		s.commit(group)
	}
}

// errRollback makes a group's transaction roll back.
var errRollback = errors.New("a write of the group failed")

// commit runs a group of writes in one transaction and tells each its
// outcome. A refusal is the write's own outcome; any other error of a
// write rolls the group back, and then each write runs alone (as bbolt's
// Batch does), so that only the failing one fails.
func (s *Store) commit(group []*writeOp) {
	if len(group) == 1 {
		op := group[0]
		op.done <- s.run(op.ctx, op.action, true, op.fn)
		return
	}
	errs := make([]error, len(group))
	err := s.db.Update(func(btx *bolt.Tx) error {
		t := openTx(btx)
		for i, op := range group {
			if err := op.ctx.Err(); err != nil {
				errs[i] = fmt.Errorf("%s: %w", op.action, err)
				continue
			}
			err := op.fn(t)
			if err != nil && !isRefusal(err) {
				return errRollback
			}
			if err != nil {
				errs[i] = fmt.Errorf("%s: %w", op.action, err)
			}
		}
		return nil
	})
	switch {
	case errors.Is(err, errRollback):
		for _, op := range group {
			op.done <- s.run(op.ctx, op.action, true, op.fn)
		}
		return
	case err != nil:
		for i, op := range group {
			errs[i] = s.commitError(op.action, err)
		}
	}
	for i, op := range group {
		op.done <- errs[i]
	}
}

// isRefusal reports whether a write's error is one of the contract's
// refusals, which every write decides before it writes anything.
func isRefusal(err error) bool {
	for _, sentinel := range []error{warmpool.ErrNoCapacity, warmpool.ErrConflict, warmpool.ErrNotFound,
		warmpool.ErrLeaseEnded, warmpool.ErrLeaseNotHeld} {
		if errors.Is(err, sentinel) {
			return true
		}
	}
	return false
}

// commitError is the error of a write whose transaction bbolt could not
// run or commit.
func (s *Store) commitError(action string, err error) error {
	if errors.Is(err, bolt.ErrDatabaseNotOpen) || s.closed.Load() {
		return fmt.Errorf("%s: %w", action, warmpool.ErrClosed)
	}
	return fmt.Errorf("%s: %w: %w", action, warmpool.ErrUnavailable, err)
}

// view runs fn in one read-only transaction, like update.
func (s *Store) view(ctx context.Context, action string, fn func(*tx) error) error {
	return s.run(ctx, action, false, fn)
}

func (s *Store) run(ctx context.Context, action string, writable bool, fn func(*tx) error) error {
	if s.closed.Load() {
		return fmt.Errorf("%s: %w", action, warmpool.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", action, err)
	}
	var fnErr error
	body := func(btx *bolt.Tx) error {
		fnErr = fn(openTx(btx))
		return fnErr
	}
	var err error
	if writable {
		err = s.db.Update(body)
	} else {
		err = s.db.View(body)
	}
	switch {
	case err == nil:
		return nil
	case fnErr != nil && err == fnErr:
		return fmt.Errorf("%s: %w", action, err)
	default:
		return s.commitError(action, err)
	}
}

// tx is one transaction with its buckets at hand.
type tx struct {
	tasks, tasksPool, ready            *bolt.Bucket
	leases, owner, expiry, ended, idem *bolt.Bucket
	locks, countsB, env                *bolt.Bucket
	pools, poolsClass, classCounts     *bolt.Bucket
}

func openTx(btx *bolt.Tx) *tx {
	return &tx{
		tasks: btx.Bucket(bucketTasks), tasksPool: btx.Bucket(bucketTasksPool), ready: btx.Bucket(bucketTasksReady),
		leases: btx.Bucket(bucketLeases), owner: btx.Bucket(bucketOwner),
		expiry: btx.Bucket(bucketExpiry), ended: btx.Bucket(bucketEnded), idem: btx.Bucket(bucketIdem),
		locks: btx.Bucket(bucketLocks), countsB: btx.Bucket(bucketCounts), env: btx.Bucket(bucketEnv),
		pools: btx.Bucket(bucketPools), poolsClass: btx.Bucket(bucketPoolsClass), classCounts: btx.Bucket(bucketClassCounts),
	}
}

func (t *tx) getTask(id string) (warmpool.TaskRecord, bool, error) {
	return getJSON[warmpool.TaskRecord](t.tasks, id, "task")
}

// claimable returns the task a claim takes: req.TaskID (ready or
// launching, in the pool, of req.Spec when set), or the oldest ready task
// of the pool of req.Spec. Ready tasks of another spec that it meets on the
// way, at most warmpool.StaleScan, become stopping in the same transaction
// and are returned as stale; the task is zero when only those were met.
func (t *tx) claimable(req warmpool.ClaimRequest) (warmpool.TaskRecord, []warmpool.TaskRecord, error) {
	if taskID := req.TaskID; taskID != "" {
		task, ok, err := t.getTask(taskID)
		switch {
		case err != nil:
			return task, nil, err
		case !ok || task.Pool != req.Pool:
			return task, nil, fmt.Errorf("task %s in pool %q: %w", taskID, req.Pool, warmpool.ErrNotFound)
		case task.State != warmpool.TaskReady && task.State != warmpool.TaskLaunching:
			return task, nil, fmt.Errorf("task %s is %s, not ready or launching: %w", taskID, task.State, warmpool.ErrConflict)
		case req.Spec != "" && task.Spec != req.Spec:
			return task, nil, fmt.Errorf("task %s was launched for another configuration of pool %q: %w", taskID, req.Pool, warmpool.ErrConflict)
		}
		return task, nil, nil
	}
	var found warmpool.TaskRecord
	var stale []warmpool.TaskRecord
	prefix := lp(req.Pool)
	c := t.ready.Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) && len(stale) < warmpool.StaleScan; k, v = c.Next() {
		task, ok, err := t.getTask(string(v))
		if err != nil {
			return task, nil, err
		}
		if !ok || task.State != warmpool.TaskReady {
			return task, nil, fmt.Errorf("ready index names task %s which is not ready", v)
		}
		if req.Spec == "" || task.Spec == req.Spec {
			found = task
			break
		}
		stale = append(stale, task)
	}
	if found.ID == "" && len(stale) == 0 {
		return found, nil, fmt.Errorf("pool %q has no ready task: %w", req.Pool, warmpool.ErrNoCapacity)
	}
	// Retire the stale tasks met, after the walk (its cursor must not see
	// the index change under it); a refusal must come before any write.
	for i, task := range stale {
		old := task
		task.State, task.Reason, task.UpdatedAt = warmpool.TaskStopping, warmpool.ReasonStaleSpec, req.Now
		task.Version++
		if err := t.putTask(&old, task); err != nil {
			return found, nil, err
		}
		stale[i] = task
	}
	return found, stale, nil
}

// putTask writes rec and keeps the indexes and the counts in step with old
// (nil for a new record).
func (t *tx) putTask(old *warmpool.TaskRecord, rec warmpool.TaskRecord) error {
	v, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode task %s: %w", rec.ID, err)
	}
	switch {
	case old == nil:
		if err := t.count(rec.Pool, rec.State, 1); err != nil {
			return err
		}
		if rec.Class != "" {
			if err := t.countClass(rec.Class, 1); err != nil {
				return err
			}
		}
	case old.State != rec.State:
		if err := t.count(old.Pool, old.State, -1); err != nil {
			return err
		}
		if err := t.count(rec.Pool, rec.State, 1); err != nil {
			return err
		}
	}
	if old != nil && old.State == warmpool.TaskReady {
		if err := t.ready.Delete(readyKey(*old)); err != nil {
			return err
		}
	}
	if rec.State == warmpool.TaskReady {
		if err := t.ready.Put(readyKey(rec), []byte(rec.ID)); err != nil {
			return err
		}
	}
	if old == nil {
		if err := t.tasksPool.Put(concat(lp(rec.Pool), []byte(rec.ID)), nil); err != nil {
			return err
		}
	}
	return t.tasks.Put([]byte(rec.ID), v)
}

func (t *tx) deleteTask(rec warmpool.TaskRecord) error {
	if err := t.count(rec.Pool, rec.State, -1); err != nil {
		return err
	}
	if rec.Class != "" {
		if err := t.countClass(rec.Class, -1); err != nil {
			return err
		}
	}
	if rec.State == warmpool.TaskReady {
		if err := t.ready.Delete(readyKey(rec)); err != nil {
			return err
		}
	}
	if err := t.tasksPool.Delete(concat(lp(rec.Pool), []byte(rec.ID))); err != nil {
		return err
	}
	return t.tasks.Delete([]byte(rec.ID))
}

// getLease reads lease id, without its env (a lease written before the env
// was kept apart may still hold it in its record).
func (t *tx) getLease(id string) (warmpool.Lease, bool, error) {
	l, ok, err := getJSON[warmpool.Lease](t.leases, id, "lease")
	l.Env = nil
	return l, ok, err
}

// getJSON decodes the record stored under id in b; false when there is none.
func getJSON[T any](b *bolt.Bucket, id, kind string) (T, bool, error) {
	var rec T
	v := b.Get([]byte(id))
	if v == nil {
		return rec, false, nil
	}
	if err := json.Unmarshal(v, &rec); err != nil {
		return rec, false, fmt.Errorf("decode %s %s: %w", kind, id, err)
	}
	return rec, true, nil
}

// mustLease returns lease id: ErrNotFound when unknown, ErrLeaseNotHeld
// when owner is set and differs.
func (t *tx) mustLease(id, owner string) (warmpool.Lease, error) {
	l, ok, err := t.getLease(id)
	switch {
	case err != nil:
		return l, err
	case !ok:
		return l, fmt.Errorf("lease %s: %w", id, warmpool.ErrNotFound)
	case owner != "" && l.Owner != owner:
		return l, fmt.Errorf("lease %s: %w", id, warmpool.ErrLeaseNotHeld)
	}
	return l, nil
}

// putLease writes l and keeps the indexes in step with old (nil for a new
// lease).
func (t *tx) putLease(old *warmpool.Lease, l warmpool.Lease) error {
	l.Env = nil // kept apart (Claim writes it to the env bucket)
	v, err := json.Marshal(l)
	if err != nil {
		return fmt.Errorf("encode lease %s: %w", l.ID, err)
	}
	id := []byte(l.ID)
	if old == nil {
		if err := t.owner.Put(concat(lp(l.Owner), tsKey(l.CreatedAt), id), nil); err != nil {
			return err
		}
		if l.IdempotencyKey != "" {
			if err := t.idem.Put(idemKey(l.Owner, l.IdempotencyKey), id); err != nil {
				return err
			}
		}
	}
	if old != nil && old.State == warmpool.LeaseActive {
		if err := t.expiry.Delete(concat(tsKey(old.ExpiresAt), id)); err != nil {
			return err
		}
	}
	if l.State == warmpool.LeaseActive {
		if err := t.expiry.Put(concat(tsKey(l.ExpiresAt), id), nil); err != nil {
			return err
		}
	} else if old == nil || old.State == warmpool.LeaseActive {
		if err := t.ended.Put(concat(tsKey(l.EndedAt), id), nil); err != nil {
			return err
		}
	}
	return t.leases.Put(id, v)
}

// forgetIdem removes l's idempotency index entry if it still points at l.
func (t *tx) forgetIdem(l warmpool.Lease) {
	if l.IdempotencyKey == "" {
		return
	}
	k := idemKey(l.Owner, l.IdempotencyKey)
	if v := t.idem.Get(k); v != nil && string(v) == l.ID {
		_ = t.idem.Delete(k) // Delete fails only on a read-only transaction
	}
}

func (t *tx) deleteLease(l warmpool.Lease) error {
	id := []byte(l.ID)
	t.forgetIdem(l)
	for _, del := range []struct {
		b *bolt.Bucket
		k []byte
	}{
		{t.owner, concat(lp(l.Owner), tsKey(l.CreatedAt), id)},
		{t.expiry, concat(tsKey(l.ExpiresAt), id)},
		{t.ended, concat(tsKey(l.EndedAt), id)},
		{t.env, id},
		{t.leases, id},
	} {
		if err := del.b.Delete(del.k); err != nil {
			return err
		}
	}
	return nil
}

func sortNewestFirst(ls []warmpool.Lease) {
	slices.SortFunc(ls, func(a, b warmpool.Lease) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
}

// reverseScan visits the keys with prefix (every key for nil) from the
// last to the first, until visit returns false or an error.
func reverseScan(c *bolt.Cursor, prefix []byte, visit func(k []byte) (bool, error)) error {
	var k []byte
	if upper := prefixEnd(prefix); upper == nil {
		k, _ = c.Last()
	} else if k, _ = c.Seek(upper); k == nil {
		k, _ = c.Last()
	} else {
		k, _ = c.Prev()
	}
	for ; k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Prev() {
		more, err := visit(k)
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// prefixEnd returns the smallest key greater than every key with prefix,
// or nil when there is none (empty prefix, or all 0xff).
func prefixEnd(prefix []byte) []byte {
	end := bytes.Clone(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// countStates are the states the counts bucket counts.
var countStates = []warmpool.TaskState{warmpool.TaskLaunching, warmpool.TaskReady, warmpool.TaskLeased, warmpool.TaskStopping}

func countKey(pool string, state warmpool.TaskState) []byte {
	return concat(lp(pool), []byte(state))
}

// counts returns the pool's counts by state.
func (t *tx) counts(pool string) warmpool.TaskCounts {
	var c warmpool.TaskCounts
	for _, st := range countStates {
		if v := t.countsB.Get(countKey(pool, st)); len(v) == 8 {
			c.Add(st, int(binary.BigEndian.Uint64(v)))
		}
	}
	return c
}

// count adds n to the count of the pool's tasks in state.
func (t *tx) count(pool string, state warmpool.TaskState, n int) error {
	k := countKey(pool, state)
	var cur int64
	if v := t.countsB.Get(k); len(v) == 8 {
		cur = int64(binary.BigEndian.Uint64(v))
	}
	cur += int64(n)
	if cur <= 0 {
		return t.countsB.Delete(k)
	}
	return t.countsB.Put(k, binary.BigEndian.AppendUint64(nil, uint64(cur)))
}

// recount rebuilds the counts buckets (pools' and classes') from the task
// records.
func recount(t *tx) error {
	for _, b := range []*bolt.Bucket{t.countsB, t.classCounts} {
		var keys [][]byte
		if err := b.ForEach(func(k, _ []byte) error { keys = append(keys, bytes.Clone(k)); return nil }); err != nil {
			return err
		}
		for _, k := range keys {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
	}
	return t.tasks.ForEach(func(_, v []byte) error {
		var rec warmpool.TaskRecord
		if err := json.Unmarshal(v, &rec); err != nil {
			return fmt.Errorf("decode task: %w", err)
		}
		if rec.Class != "" {
			if err := t.countClass(rec.Class, 1); err != nil {
				return err
			}
		}
		return t.count(rec.Pool, rec.State, 1)
	})
}

// lp length-prefixes s, so that a prefix scan on lp(s) never matches a
// longer string that starts with s.
func lp(s string) []byte {
	b := binary.AppendUvarint(make([]byte, 0, len(s)+2), uint64(len(s)))
	return append(b, s...)
}

// tsKey encodes t as 8 big-endian bytes of Unix nanoseconds (times before
// 1970, and the zero time, encode as 0), so keys sort by time.
func tsKey(t time.Time) []byte {
	var n int64
	if !t.IsZero() && t.Unix() > 0 {
		n = t.UnixNano()
	}
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), uint64(n))
}

func readyKey(rec warmpool.TaskRecord) []byte {
	return concat(lp(rec.Pool), tsKey(rec.CreatedAt), []byte(rec.ID))
}

func idemKey(owner, key string) []byte { return concat(lp(owner), []byte(key)) }

func concat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
