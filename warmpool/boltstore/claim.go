package boltstore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/quarryhq/quarry/warmpool"
)

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
