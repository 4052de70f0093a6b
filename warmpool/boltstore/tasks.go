package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/quarryhq/quarry/warmpool"
)

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
	buckets := func(t *tx) (*bolt.Bucket, *bolt.Bucket) { return t.tasks, t.tasksPool }
	tasks, next, err := listPage(s, ctx, "list tasks page", buckets, pool, cursor, limit, "pool index names missing task", (*tx).getTask)
	return warmpool.TaskPage{Tasks: tasks, Next: next}, err
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

func (t *tx) getTask(id string) (warmpool.TaskRecord, bool, error) {
	return getJSON[warmpool.TaskRecord](t.tasks, id, "task")
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

// countStates are the states the counts bucket counts.
var countStates = []warmpool.TaskState{warmpool.TaskLaunching, warmpool.TaskReady, warmpool.TaskLeased, warmpool.TaskStopping}

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
