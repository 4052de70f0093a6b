package boltstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/quarryhq/quarry/warmpool"
)

// schemaVersion is written to the meta bucket; Open refuses other versions.
const schemaVersion = "1"

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

// listPage checks limit and reads one page in one read transaction: the
// records of the index bucket (buckets' second) under lp(key) when key is
// set, else of the records' own bucket (its first), with walkPage.
func listPage[T any](s *Store, ctx context.Context, action string, buckets func(*tx) (records, index *bolt.Bucket),
	key, cursor string, limit int, missing string, get func(*tx, string) (T, bool, error)) ([]T, string, error) {
	if err := warmpool.CheckPage(limit); err != nil {
		return nil, "", err
	}
	var recs []T
	var next string
	err := s.view(ctx, action, func(t *tx) error {
		b, index := buckets(t)
		var prefix []byte
		if key != "" {
			b, prefix = index, lp(key)
		}
		var err error
		recs, next, err = walkPage(b, prefix, cursor, limit, missing, func(id string) (T, bool, error) { return get(t, id) })
		return err
	})
	return recs, next, err
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
