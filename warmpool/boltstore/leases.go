package boltstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/quarryhq/quarry/warmpool"
)

// purgeBatch bounds how many leases one PurgeLeases transaction deletes, so
// that a large purge does not hold the write lock for long.
const purgeBatch = 1000

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

// PauseLease implements warmpool.LeaseStore.
func (s *Store) PauseLease(ctx context.Context, id, owner string, paused bool, now time.Time) (warmpool.Lease, error) {
	if err := warmpool.CheckRenew(now); err != nil {
		return warmpool.Lease{}, err
	}
	return s.changeLease(ctx, "pause lease", id, owner, func(_ *tx, l warmpool.Lease) (warmpool.Lease, error) {
		if !l.ExpiresAt.After(now) {
			return l, fmt.Errorf("lease %s expired at %s: %w", id, l.ExpiresAt.Format(time.RFC3339), warmpool.ErrLeaseEnded)
		}
		if paused == !l.PausedAt.IsZero() {
			return warmpool.Lease{}, warmpool.PausedConflict(id, paused)
		}
		l.PausedAt = time.Time{}
		if paused {
			l.PausedAt = now
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

// getLease reads lease id, without its env (a lease written before the env
// was kept apart may still hold it in its record).
func (t *tx) getLease(id string) (warmpool.Lease, bool, error) {
	l, ok, err := getJSON[warmpool.Lease](t.leases, id, "lease")
	l.Env = nil
	return l, ok, err
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
