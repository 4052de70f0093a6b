package boltstore

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	"github.com/quarryhq/quarry/warmpool"
	bolt "go.etcd.io/bbolt"
)

// Buckets of on-demand pools (warmpool.PoolStore).
var (
	bucketPools       = []byte("pools")          // pool name → PoolRecord JSON
	bucketPoolsClass  = []byte("pools_by_class") // lp(class) name → ""
	bucketClassCounts = []byte("class_counts")   // lp(class) → uint64: tasks of the class's pools
)

// CreatePool implements warmpool.PoolStore.
func (s *Store) CreatePool(ctx context.Context, rec warmpool.PoolRecord) (warmpool.PoolRecord, error) {
	if err := warmpool.CheckPool(rec); err != nil {
		return warmpool.PoolRecord{}, err
	}
	var out warmpool.PoolRecord
	err := s.update(ctx, "create pool", func(t *tx) error {
		if t.pools.Get([]byte(rec.Name)) != nil {
			return fmt.Errorf("pool %s exists already: %w", rec.Name, warmpool.ErrConflict)
		}
		out = rec
		out.State, out.Version = warmpool.PoolActive, 1
		if err := t.poolsClass.Put(concat(lp(rec.Class), []byte(rec.Name)), nil); err != nil {
			return err
		}
		return t.putPool(out)
	})
	if err != nil {
		return warmpool.PoolRecord{}, err
	}
	return out, nil
}

// UpdatePool implements warmpool.PoolStore: a write conditional on Version.
func (s *Store) UpdatePool(ctx context.Context, rec warmpool.PoolRecord) (warmpool.PoolRecord, error) {
	if err := warmpool.CheckPool(rec); err != nil {
		return warmpool.PoolRecord{}, err
	}
	var out warmpool.PoolRecord
	err := s.update(ctx, "update pool", func(t *tx) error {
		old, err := t.mustPool(rec.Name, rec.Version)
		if err != nil {
			return err
		}
		switch {
		case rec.Class != old.Class:
			return fmt.Errorf("pool %s: its class cannot change from %q to %q", rec.Name, old.Class, rec.Class)
		case rec.State == warmpool.PoolEnded && old.State != warmpool.PoolEnded:
			return fmt.Errorf("pool %s: UpdatePool cannot end a pool (EndPool does)", rec.Name)
		}
		out = rec
		if out.State == "" {
			out.State = old.State
		}
		out.Acquires = old.Acquires // TouchPool's, counted without a version
		if old.LastUsed.After(out.LastUsed) {
			out.LastUsed = old.LastUsed
		}
		out.Version++
		return t.putPool(out)
	})
	if err != nil {
		return warmpool.PoolRecord{}, err
	}
	return out, nil
}

// TouchPool implements warmpool.PoolStore.
func (s *Store) TouchPool(ctx context.Context, name string, at time.Time, n int) error {
	return s.update(ctx, "touch pool", func(t *tx) error {
		rec, ok, err := t.getPool(name)
		switch {
		case err != nil:
			return err
		case !ok:
			return fmt.Errorf("pool %s: %w", name, warmpool.ErrNotFound)
		}
		rec.Acquires += int64(n)
		if at.After(rec.LastUsed) {
			rec.LastUsed = at
		}
		return t.putPool(rec)
	})
}

// EndPool implements warmpool.PoolStore: the version, the state and the
// pool's counts are read in the transaction that ends it.
func (s *Store) EndPool(ctx context.Context, rec warmpool.PoolRecord, now time.Time) (warmpool.PoolRecord, error) {
	var out warmpool.PoolRecord
	err := s.update(ctx, "end pool", func(t *tx) error {
		old, err := t.mustPool(rec.Name, rec.Version)
		if err != nil {
			return err
		}
		if old.State != warmpool.PoolActive {
			return fmt.Errorf("pool %s is %s, not active: %w", rec.Name, old.State, warmpool.ErrConflict)
		}
		if n := t.counts(rec.Name).Total(); n > 0 {
			return fmt.Errorf("pool %s has %d tasks: %w", rec.Name, n, warmpool.ErrConflict)
		}
		out = old
		out.State, out.EndedAt = warmpool.PoolEnded, now
		out.Version++
		return t.putPool(out)
	})
	if err != nil {
		return warmpool.PoolRecord{}, err
	}
	return out, nil
}

// DeletePool implements warmpool.PoolStore.
func (s *Store) DeletePool(ctx context.Context, rec warmpool.PoolRecord) error {
	return s.update(ctx, "delete pool", func(t *tx) error {
		old, ok, err := t.getPool(rec.Name)
		switch {
		case err != nil || !ok:
			return err
		case old.Version != rec.Version:
			return fmt.Errorf("pool %s is at version %d, not %d: %w", rec.Name, old.Version, rec.Version, warmpool.ErrConflict)
		case old.State != warmpool.PoolEnded:
			return fmt.Errorf("pool %s is %s, not ended: %w", rec.Name, old.State, warmpool.ErrConflict)
		}
		if err := t.poolsClass.Delete(concat(lp(old.Class), []byte(old.Name))); err != nil {
			return err
		}
		return t.pools.Delete([]byte(old.Name))
	})
}

// GetPool implements warmpool.PoolStore.
func (s *Store) GetPool(ctx context.Context, name string) (warmpool.PoolRecord, error) {
	return getOne(s, ctx, "get pool", "pool", name, (*tx).getPool)
}

// ListPoolsPage implements warmpool.PoolStore, in name order; the cursor
// is the last name of the page.
func (s *Store) ListPoolsPage(ctx context.Context, class, cursor string, limit int) (warmpool.PoolPage, error) {
	buckets := func(t *tx) (*bolt.Bucket, *bolt.Bucket) { return t.pools, t.poolsClass }
	pools, next, err := listPage(s, ctx, "list pools page", buckets, class, cursor, limit, "class index names missing pool", (*tx).getPool)
	return warmpool.PoolPage{Pools: pools, Next: next}, err
}

// ReserveClassTasks implements warmpool.PoolStore: the pool's record, its
// counts and its class's are read in the transaction that reserves.
func (s *Store) ReserveClassTasks(ctx context.Context, class string, classMax int, pool string, maxTotal int, recs []warmpool.TaskRecord) error {
	if err := warmpool.CheckReserveClass(class, classMax, pool, recs); err != nil {
		return err
	}
	if len(recs) == 0 {
		return nil
	}
	return s.update(ctx, "reserve tasks", func(t *tx) error {
		rec, ok, err := t.getPool(pool)
		switch {
		case err != nil:
			return err
		case !ok || rec.State != warmpool.PoolActive:
			return fmt.Errorf("pool %q is not active: %w", pool, warmpool.ErrNoCapacity)
		case rec.Class != class:
			return fmt.Errorf("pool %q is of class %q, not %q", pool, rec.Class, class)
		}
		if n := t.classCount(class); n+len(recs) > classMax {
			return fmt.Errorf("class %q has %d of max_total %d tasks, %d more do not fit: %w", class, n, classMax, len(recs), warmpool.ErrNoCapacity)
		}
		for i := range recs {
			recs[i].Class = class
		}
		return t.reserve(pool, maxTotal, recs)
	})
}

// CountClass implements warmpool.PoolStore: one counter read.
func (s *Store) CountClass(ctx context.Context, class string) (int, error) {
	var n int
	err := s.view(ctx, "count class", func(t *tx) error {
		n = t.classCount(class)
		return nil
	})
	return n, err
}

func (t *tx) getPool(name string) (warmpool.PoolRecord, bool, error) {
	return getJSON[warmpool.PoolRecord](t.pools, name, "pool")
}

// mustPool returns pool name's record if it is at version: ErrNotFound
// when there is none, ErrConflict when its version differs.
func (t *tx) mustPool(name string, version int64) (warmpool.PoolRecord, error) {
	rec, ok, err := t.getPool(name)
	switch {
	case err != nil:
		return rec, err
	case !ok:
		return rec, fmt.Errorf("pool %s: %w", name, warmpool.ErrNotFound)
	case rec.Version != version:
		return rec, fmt.Errorf("pool %s is at version %d, not %d: %w", name, rec.Version, version, warmpool.ErrConflict)
	}
	return rec, nil
}

func (t *tx) putPool(rec warmpool.PoolRecord) error {
	v, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode pool %s: %w", rec.Name, err)
	}
	return t.pools.Put([]byte(rec.Name), v)
}

// classCount returns how many tasks the class's pools have.
func (t *tx) classCount(class string) int {
	if v := t.classCounts.Get(lp(class)); len(v) == 8 {
		return int(binary.BigEndian.Uint64(v))
	}
	return 0
}

// countClass adds n to the class's task count.
func (t *tx) countClass(class string, n int) error {
	cur := t.classCount(class) + n
	if cur <= 0 {
		return t.classCounts.Delete(lp(class))
	}
	return t.classCounts.Put(lp(class), binary.BigEndian.AppendUint64(nil, uint64(cur)))
}
