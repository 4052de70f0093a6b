package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"golang.org/x/sync/errgroup"

	"github.com/quarryhq/quarry/warmpool"
)

// Items of EndLease's transaction, by index: the lease, its task (when
// included), its idempotency key (when it has one), the task's counter
// (with the task, last: it has no condition).
const (
	endLease = iota
	endTask
)

// keyIndex is the index of the idempotency key's item in EndLease's
// transaction.
func keyIndex(withTask bool) int {
	if withTask {
		return endTask + 1
	}
	return endLease + 1
}

// liveLease reads lease id (strongly consistent); false when it does not
// exist or its TTL has passed (purged, as far as the contract goes).
func (s *Store) liveLease(ctx context.Context, id string) (warmpool.Lease, bool, error) {
	if id == "" {
		return warmpool.Lease{}, false, nil
	}
	it, err := s.getItem(ctx, s.cfg.LeasesTable, leasePK(id))
	if err != nil || it == nil || ttlPassed(it, s.now()) {
		return warmpool.Lease{}, false, err
	}
	l, err := decodeLease(it)
	return l, err == nil, err
}

// GetLease implements warmpool.LeaseStore: one strongly consistent
// GetItem. A lease whose TTL has passed is ErrNotFound, as if purged.
func (s *Store) GetLease(ctx context.Context, id string) (warmpool.Lease, error) {
	const action = "get lease"
	if err := s.begin(ctx, action); err != nil {
		return warmpool.Lease{}, err
	}
	l, ok, err := s.liveLease(ctx, id)
	if err != nil {
		return warmpool.Lease{}, translate(action, err)
	}
	if !ok {
		return warmpool.Lease{}, fmt.Errorf("get lease %s: %w", id, warmpool.ErrNotFound)
	}
	return l, nil
}

// RenewLease implements warmpool.LeaseStore: one UpdateItem conditional on
// the owner, the state (active) and the stored expiry (after now); with a
// zero expiresAt the update itself adds the stored duration to now. On
// ErrLeaseEnded it also returns the lease as stored.
func (s *Store) RenewLease(ctx context.Context, id, owner string, expiresAt, now time.Time) (warmpool.Lease, error) {
	const action = "renew lease"
	e, cond, err := s.activeUpdate(ctx, action, now)
	if err != nil {
		return warmpool.Lease{}, err
	}
	if expiresAt.IsZero() { // by the lease's own duration
		at := e.v(avTime(now)) + " + " + e.n(fDuration)
		e.set = append(e.set, e.n(fExpiresAt)+" = "+at, e.n(attrExpirySK)+" = "+at)
		cond += " AND " + e.n(fDuration) + " > " + e.v(avN(0))
	} else {
		e.Set(fExpiresAt, avTime(expiresAt))
		e.Set(attrExpirySK, avTime(expiresAt))
	}
	e.Add(fVersion, avN(1))
	return s.updateLease(ctx, action, id, owner, e, cond, func(l warmpool.Lease) error {
		switch {
		case !l.ExpiresAt.After(now):
			return fmt.Errorf("renew lease %s: expired at %s: %w", id, l.ExpiresAt.Format(time.RFC3339Nano), warmpool.ErrLeaseEnded)
		case expiresAt.IsZero() && l.Duration <= 0:
			return fmt.Errorf("renew lease %s: it has no duration to renew it by", id)
		}
		return fmt.Errorf("renew lease %s: changed concurrently: %w", id, warmpool.ErrConflict)
	})
}

// activeUpdate begins an update of a lease at now (CheckRenew's check)
// and returns its expression and the condition that the lease exists, is
// active and has not expired.
func (s *Store) activeUpdate(ctx context.Context, action string, now time.Time) (*expr, string, error) {
	if err := warmpool.CheckRenew(now); err != nil {
		return nil, "", err
	}
	if err := s.begin(ctx, action); err != nil {
		return nil, "", err
	}
	e := newExpr()
	cond := "attribute_exists(" + e.n(attrPK) + ") AND " + e.n(fState) + " = " + e.v(avS(string(warmpool.LeaseActive))) +
		" AND " + e.n(fExpiresAt) + " > " + e.v(avTime(now))
	return e, cond, nil
}

// updateLease makes one conditional UpdateItem (e, cond: the caller's,
// with the owner's condition added when owner is set) of lease id and
// returns the lease as updated; a refused condition is explained from the
// lease as stored (refusal, with active for an active lease).
func (s *Store) updateLease(ctx context.Context, action, id, owner string, e *expr, cond string, active func(warmpool.Lease) error) (warmpool.Lease, error) {
	if owner != "" {
		cond += " AND " + e.n(fOwner) + " = " + e.v(avS(owner))
	}
	out, err := s.db.updateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: ptr(s.cfg.LeasesTable), Key: key(leasePK(id)), UpdateExpression: e.update(),
		ConditionExpression: &cond, ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
		ReturnValues: types.ReturnValueAllNew, ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if old, ok := isConditionFailed(err); ok {
		if len(old) == 0 {
			// An emulator may not return the old item: read it.
			if old, err = s.getItem(ctx, s.cfg.LeasesTable, leasePK(id)); err != nil {
				return warmpool.Lease{}, translate(action, err)
			}
		}
		return s.refusal(action, id, owner, old, active)
	}
	if err != nil {
		return warmpool.Lease{}, translate(action, err)
	}
	l, err := decodeLease(out.Attributes)
	if err != nil {
		return warmpool.Lease{}, fmt.Errorf("%s %s: %w", action, id, err)
	}
	return l, nil
}

// PauseLease implements warmpool.LeaseStore: one conditional UpdateItem.
func (s *Store) PauseLease(ctx context.Context, id, owner string, paused bool, now time.Time) (warmpool.Lease, error) {
	const action = "pause lease"
	e, cond, err := s.activeUpdate(ctx, action, now)
	if err != nil {
		return warmpool.Lease{}, err
	}
	if paused {
		cond += " AND attribute_not_exists(" + e.n(fPausedAt) + ")"
		e.Set(fPausedAt, avTime(now))
	} else {
		cond += " AND attribute_exists(" + e.n(fPausedAt) + ")"
		e.remove = append(e.remove, e.n(fPausedAt))
	}
	e.Add(fVersion, avN(1))
	return s.updateLease(ctx, action, id, owner, e, cond, func(l warmpool.Lease) error {
		switch {
		case !l.ExpiresAt.After(now):
			return fmt.Errorf("pause lease %s: expired at %s: %w", id, l.ExpiresAt.Format(time.RFC3339Nano), warmpool.ErrLeaseEnded)
		case paused == !l.PausedAt.IsZero():
			return warmpool.PausedConflict(id, paused)
		}
		return fmt.Errorf("pause lease %s: changed concurrently: %w", id, warmpool.ErrConflict)
	})
}

// refusal explains why a conditional write on lease id was refused, from
// the lease as stored (old, nil when missing): ErrNotFound, ErrLeaseNotHeld,
// ErrLeaseEnded (with the lease), or what active explains for an active
// lease.
func (s *Store) refusal(action, id, owner string, old item, active func(warmpool.Lease) error) (warmpool.Lease, error) {
	if len(old) == 0 || ttlPassed(old, s.now()) {
		return warmpool.Lease{}, fmt.Errorf("%s %s: %w", action, id, warmpool.ErrNotFound)
	}
	l, err := decodeLease(old)
	switch {
	case err != nil:
		return warmpool.Lease{}, fmt.Errorf("%s: %w", action, err)
	case owner != "" && l.Owner != owner:
		return warmpool.Lease{}, fmt.Errorf("%s %s: %w", action, id, warmpool.ErrLeaseNotHeld)
	case l.State != warmpool.LeaseActive:
		return l, fmt.Errorf("%s %s: lease is %s: %w", action, id, l.State, warmpool.ErrLeaseEnded)
	}
	if err := active(l); err != nil {
		if errors.Is(err, warmpool.ErrLeaseEnded) {
			return l, err
		}
		return warmpool.Lease{}, err
	}
	return l, nil
}

// EndLease implements warmpool.LeaseStore. It reads the lease, then in one
// transaction rewrites it ended (conditional on the version read), moves
// its task to stopping (conditional on the task still being leased by it)
// and frees or ages its idempotency key (conditional on the key still
// naming it). A task or key that no longer belongs to the lease is left
// alone (the transaction is retried without it). On ErrLeaseEnded it also
// returns the lease as stored. Two calls on the happy path.
func (s *Store) EndLease(ctx context.Context, id string, end warmpool.LeaseEnd) (warmpool.Lease, error) {
	const action = "end lease"
	if err := warmpool.CheckEnd(id, end); err != nil {
		return warmpool.Lease{}, err
	}
	if err := s.begin(ctx, action); err != nil {
		return warmpool.Lease{}, err
	}
	withTask, withKey := true, true
	check := func(l warmpool.Lease) error {
		if end.OnlyIfExpired && l.ExpiresAt.After(end.Now) {
			return fmt.Errorf("end lease %s: renewed until %s: %w", id, l.ExpiresAt.Format(time.RFC3339Nano), warmpool.ErrConflict)
		}
		return nil
	}
	// The caller's copy of an active lease spares the first read: the end
	// is written on the condition that the lease is still at its version.
	// Owner, task and key never change, and its expiry only moves on, so
	// the checks hold on the copy; a stale copy fails the write and the
	// lease is read.
	copied := end.Read != nil && end.Read.ID == id && end.Read.State == warmpool.LeaseActive && end.Read.Version > 0
	for round := 0; round < maxRounds; round++ {
		var l warmpool.Lease
		fromCopy := copied
		if copied {
			copied = false
			l = *end.Read
			l.Env = nil
			switch {
			case end.Owner != "" && l.Owner != end.Owner:
				return warmpool.Lease{}, fmt.Errorf("%s %s: %w", action, id, warmpool.ErrLeaseNotHeld)
			case check(l) != nil:
				return warmpool.Lease{}, check(l)
			}
		} else {
			it, err := s.getItem(ctx, s.cfg.LeasesTable, leasePK(id))
			if err != nil {
				return warmpool.Lease{}, translate(action, err)
			}
			if l, err = s.refusal(action, id, end.Owner, it, check); err != nil {
				return l, err
			}
		}
		ended := l
		ended.State = end.State
		ended.Reason = end.Reason
		ended.EndedAt = end.Now
		ended.Version = l.Version + 1
		items := s.endItems(l, ended, end, withTask, withKey)
		_, err := s.db.transact(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items, ClientRequestToken: requestToken()})
		if err == nil {
			return ended, nil
		}
		reasons, ok := cancelReasons(err)
		if !ok {
			return warmpool.Lease{}, translate(action, err)
		}
		retry, throttled := retryableReasons(reasons)
		switch {
		case reasonCode(reasons, endLease) == reasonCondition:
			// The lease changed since it was read (a renewal, another end): read again.
			if fromCopy {
				continue // the copy was stale: no race lost, no pause
			}
		case withTask && reasonCode(reasons, endTask) == reasonCondition:
			withTask = false // the task is not this lease's any more
			continue
		case withKey && l.IdempotencyKey != "" && reasonCode(reasons, keyIndex(withTask)) == reasonCondition:
			withKey = false // the key names another lease
			continue
		case throttled:
			return warmpool.Lease{}, fmt.Errorf("end lease %s: %w: %w", id, warmpool.ErrUnavailable, err)
		case !retry:
			return warmpool.Lease{}, translate(action, err)
		}
		if err := backoff(ctx, round); err != nil {
			return warmpool.Lease{}, translate(action, err)
		}
	}
	return warmpool.Lease{}, fmt.Errorf("end lease %s: lost %d races in a row: %w", id, maxRounds, warmpool.ErrUnavailable)
}

// endItems builds EndLease's transaction: the lease (always first), the
// task (second, when withTask), the idempotency key (next, when the lease
// has one and withKey) and, with the task, its counter item (last).
func (s *Store) endItems(old, ended warmpool.Lease, end warmpool.LeaseEnd, withTask, withKey bool) []types.TransactWriteItem {
	cfg := s.cfg
	le := newExpr()
	lcond := le.n(fVersion) + " = " + le.v(avN(old.Version))
	items := []types.TransactWriteItem{{Put: &types.Put{
		TableName: ptr(cfg.LeasesTable), Item: leaseItem(ended, cfg.Shards, cfg.EndedTTL, end.ForgetIdempotencyKey),
		ConditionExpression: &lcond, ExpressionAttributeNames: le.Names(), ExpressionAttributeValues: le.Values(),
	}}}
	if withTask {
		reason := "lease " + string(end.State)
		if end.Reason != "" {
			reason += ": " + end.Reason
		}
		te := newExpr()
		te.Set(fState, avS(string(warmpool.TaskStopping)))
		te.Set(fReason, avS(reason))
		te.Set(fUpdatedAt, avTime(end.Now))
		te.Add(fVersion, avN(1))
		tcond := te.n(fState) + " = " + te.v(avS(string(warmpool.TaskLeased))) + " AND " + te.n(fLeaseID) + " = " + te.v(avS(old.ID))
		items = append(items, types.TransactWriteItem{Update: &types.Update{
			TableName: ptr(cfg.TasksTable), Key: key(taskPK(old.TaskID)), UpdateExpression: te.update(),
			ConditionExpression: &tcond, ExpressionAttributeNames: te.Names(), ExpressionAttributeValues: te.Values(),
		}})
	}
	if withKey && old.IdempotencyKey != "" {
		ie := newExpr()
		icond := ie.n(fLeaseID) + " = " + ie.v(avS(old.ID))
		k := key(idemPK(old.Owner, old.IdempotencyKey))
		if end.ForgetIdempotencyKey {
			items = append(items, types.TransactWriteItem{Delete: &types.Delete{
				TableName: ptr(cfg.LeasesTable), Key: k, ConditionExpression: &icond,
				ExpressionAttributeNames: ie.Names(), ExpressionAttributeValues: ie.Values(),
			}})
		} else {
			ie.Set(attrTTL, avN(ttlOf(ended.EndedAt, cfg.EndedTTL)))
			items = append(items, types.TransactWriteItem{Update: &types.Update{
				TableName: ptr(cfg.LeasesTable), Key: k, UpdateExpression: ie.update(), ConditionExpression: &icond,
				ExpressionAttributeNames: ie.Names(), ExpressionAttributeValues: ie.Values(),
			}})
		}
	}
	if withTask {
		items = append(items, *countUpdate(cfg, old.Pool, old.TaskID, warmpool.TaskLeased, warmpool.TaskStopping))
	}
	return items
}

// LeaseByKey implements warmpool.LeaseStore: a GetItem of the key's item,
// then of the lease it names (both strongly consistent). A key or lease
// past its TTL is gone.
func (s *Store) LeaseByKey(ctx context.Context, owner, key string) (warmpool.Lease, error) {
	const action = "lease by key"
	if err := s.begin(ctx, action); err != nil {
		return warmpool.Lease{}, err
	}
	it, err := s.getItem(ctx, s.cfg.LeasesTable, idemPK(owner, key))
	if err != nil {
		return warmpool.Lease{}, translate(action, err)
	}
	if it == nil || ttlPassed(it, s.now()) {
		return warmpool.Lease{}, fmt.Errorf("idempotency key %q: %w", key, warmpool.ErrNotFound)
	}
	id := (&decoder{it: it}).s(fLeaseID)
	l, ok, err := s.liveLease(ctx, id)
	switch {
	case err != nil:
		return warmpool.Lease{}, translate(action, err)
	case !ok || l.Owner != owner:
		return warmpool.Lease{}, fmt.Errorf("lease %s of idempotency key %q: %w", id, key, warmpool.ErrNotFound)
	}
	return l, nil
}

// ListLeases implements warmpool.LeaseStore, newest first. With Owner it
// queries the owner's shards of leases-by-owner, with ExpiresBefore the
// shards of active-by-expiry (the reaper); otherwise it scans the table
// (operators only). Index hits are read with strongly consistent
// BatchGetItem and filtered again, so states are current.
func (s *Store) ListLeases(ctx context.Context, f warmpool.LeaseFilter) ([]warmpool.Lease, error) {
	const action = "list leases"
	if err := s.begin(ctx, action); err != nil {
		return nil, err
	}
	var (
		items []item
		err   error
	)
	switch {
	case f.Owner != "":
		items, err = s.leasesOfOwner(ctx, f)
	case !f.ExpiresBefore.IsZero():
		items, err = s.indexedLeases(ctx, indexByExpiry, attrExpiryPK, "x", &shardQuery{sortCond: func(e *expr) string {
			return e.n(attrExpirySK) + " < " + e.v(avTime(f.ExpiresBefore))
		}})
	default:
		items, err = s.scanAll(ctx, s.cfg.LeasesTable, prefixLease)
	}
	if err != nil {
		return nil, translate(action, err)
	}
	out, err := s.filterLeases(items, f)
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	return out, nil
}

// leasesOfOwner returns the items of f.Owner's leases. Without filters
// besides the owner and a limit, each shard reads only its newest
// f.Limit; otherwise every lease of the owner is read.
func (s *Store) leasesOfOwner(ctx context.Context, f warmpool.LeaseFilter) ([]item, error) {
	q := &shardQuery{newest: true}
	onlyOwner := f.Pool == "" && f.State == "" && len(f.Labels) == 0 && f.ExpiresBefore.IsZero()
	if onlyOwner && f.Limit > 0 {
		q.limit = f.Limit
	}
	items, err := s.indexedLeases(ctx, indexByOwner, attrOwnerPK, f.Owner, q)
	if err != nil || q.limit == 0 {
		return items, err
	}
	if live := countLive(items, s.now()); live < f.Limit && len(items) >= f.Limit {
		// Leases past their TTL took places: read them all.
		q.limit = 0
		return s.indexedLeases(ctx, indexByOwner, attrOwnerPK, f.Owner, q)
	}
	return items, nil
}

func countLive(items []item, now time.Time) int {
	n := 0
	for _, it := range items {
		if !ttlPassed(it, now) {
			n++
		}
	}
	return n
}

// indexedLeases queries every shard of a keys-only lease index and reads
// the leases found.
func (s *Store) indexedLeases(ctx context.Context, index, hashAttr, prefix string, q *shardQuery) ([]item, error) {
	pks, err := s.shardKeys(ctx, s.cfg.LeasesTable, index, hashAttr, prefix, q)
	if err != nil {
		return nil, err
	}
	got, err := s.batchGet(ctx, s.cfg.LeasesTable, pks)
	if err != nil {
		return nil, err
	}
	items := make([]item, 0, len(got))
	for _, it := range got {
		items = append(items, it)
	}
	return items, nil
}

// filterLeases decodes the lease items that match f and are not past
// their TTL, newest first, at most f.Limit.
func (s *Store) filterLeases(items []item, f warmpool.LeaseFilter) ([]warmpool.Lease, error) {
	now := s.now()
	var out []warmpool.Lease
	for _, it := range items {
		if ttlPassed(it, now) {
			continue
		}
		l, err := decodeLease(it)
		if err != nil {
			return nil, err
		}
		if f.Matches(l) {
			out = append(out, l)
		}
	}
	slices.SortFunc(out, func(a, b warmpool.Lease) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

// PurgeLeases implements warmpool.LeaseStore. It queries every shard of
// ended-by-time for leases ended before endedBefore and deletes each (an
// ended lease never changes again, so the delete needs no condition), then
// its idempotency key if that still names it. Deletes run a few at a time.
func (s *Store) PurgeLeases(ctx context.Context, endedBefore time.Time) (int, error) {
	const action = "purge leases"
	if err := s.begin(ctx, action); err != nil {
		return 0, err
	}
	type ended struct{ id, owner, key string }
	var (
		fmu     sync.Mutex
		found   []ended
		deleted atomic.Int64
	)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(fanOut)
	for i := range s.cfg.Shards {
		g.Go(func() error {
			e := newExpr()
			cond := e.n(attrEndedPK) + " = " + e.v(avS(shardKey("e", i))) + " AND " + e.n(attrEndedSK) + " < " + e.v(avTime(endedBefore))
			in := &dynamodb.QueryInput{TableName: ptr(s.cfg.LeasesTable), IndexName: ptr(indexByEnd), KeyConditionExpression: &cond,
				ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values()}
			for {
				out, err := s.db.query(gctx, in)
				if err != nil {
					return err
				}
				fmu.Lock()
				for _, it := range out.Items {
					id, ok := idFromPK(pkOf(it), prefixLease)
					if !ok {
						continue
					}
					d := decoder{it: it}
					e := ended{id: id, owner: d.s(fOwner)}
					if !idemForgotten(it) {
						e.key = d.s(fIdemKey)
					}
					found = append(found, e)
				}
				fmu.Unlock()
				if len(out.LastEvaluatedKey) == 0 {
					return nil
				}
				in.ExclusiveStartKey = out.LastEvaluatedKey
			}
		})
	}
	if err := g.Wait(); err != nil {
		return 0, translate(action, err)
	}
	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(fanOut)
	for _, l := range found {
		g.Go(func() error {
			out, err := s.db.deleteItem(gctx, &dynamodb.DeleteItemInput{TableName: ptr(s.cfg.LeasesTable),
				Key: key(leasePK(l.id)), ReturnValues: types.ReturnValueAllOld})
			if err != nil {
				return err
			}
			if len(out.Attributes) > 0 {
				deleted.Add(1)
			}
			if _, err := s.db.deleteItem(gctx, &dynamodb.DeleteItemInput{TableName: ptr(s.cfg.LeasesTable), Key: key(envPK(l.id))}); err != nil {
				return err
			}
			if l.key == "" {
				return nil
			}
			e := newExpr()
			cond := e.n(fLeaseID) + " = " + e.v(avS(l.id))
			_, err = s.db.deleteItem(gctx, &dynamodb.DeleteItemInput{TableName: ptr(s.cfg.LeasesTable),
				Key: key(idemPK(l.owner, l.key)), ConditionExpression: &cond,
				ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values()})
			if _, ok := isConditionFailed(err); ok {
				return nil // the key names another lease now, or is gone
			}
			return err
		})
	}
	err := g.Wait()
	n := int(deleted.Load())
	if err != nil {
		return n, translate(action, err)
	}
	return n, nil
}
