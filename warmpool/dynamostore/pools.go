package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/quarryhq/quarry/warmpool"
)

// On-demand pools (warmpool.PoolStore). A pool record is an item of the
// tasks table, pool#<name>, which tasks-by-pool also holds under
// "@<class>#<shard of name>" (ListPoolsPage). A class's tasks are counted
// in a sharded counter of their own, ccap#<class>#<i>, within quotas of
// the class's total as a pool's are within max_total; a task of a class
// records its shard there (gshard), which DeleteTask decrements.

var _ warmpool.PoolStore = (*Store)(nil)

// scanPoolCalls bounds the Scan calls of one page of every class's
// records (ListPoolsPage with no class): the rest of the table is tasks.
const scanPoolCalls = 8

// CreatePool implements warmpool.PoolStore: one PutItem conditional on
// attribute_not_exists.
func (s *Store) CreatePool(ctx context.Context, rec warmpool.PoolRecord) (warmpool.PoolRecord, error) {
	const action = "create pool"
	if err := warmpool.CheckPool(rec); err != nil {
		return warmpool.PoolRecord{}, err
	}
	if err := s.begin(ctx, action); err != nil {
		return warmpool.PoolRecord{}, err
	}
	out := rec
	out.State, out.Version = warmpool.PoolActive, 1
	e := newExpr()
	cond := "attribute_not_exists(" + e.n(attrPK) + ")"
	_, err := s.db.putItem(ctx, &dynamodb.PutItemInput{
		TableName: ptr(s.cfg.TasksTable), Item: poolItem(out, s.cfg.Shards), ConditionExpression: &cond,
		ExpressionAttributeNames: e.Names(),
	})
	if _, ok := isConditionFailed(err); ok {
		return warmpool.PoolRecord{}, fmt.Errorf("create pool %s: it exists already: %w", rec.Name, warmpool.ErrConflict)
	}
	if err != nil {
		return warmpool.PoolRecord{}, translate(action, err)
	}
	return out, nil
}

// UpdatePool implements warmpool.PoolStore: one UpdateItem conditional on
// the version and the class (and, for a record that says ended, on the
// stored one being ended), returning the record as stored. It writes
// every field but acquires (TouchPool's), and last_used only on the
// condition that it is not later than rec's; when it is, a second
// UpdateItem writes the rest (2 calls: rec's LastUsed is older than a
// touch since the caller's read). ALL_OLD on failure tells ErrNotFound
// from ErrConflict and from a change of class or an end.
func (s *Store) UpdatePool(ctx context.Context, rec warmpool.PoolRecord) (warmpool.PoolRecord, error) {
	const action = "update pool"
	if err := warmpool.CheckPool(rec); err != nil {
		return warmpool.PoolRecord{}, err
	}
	if err := s.begin(ctx, action); err != nil {
		return warmpool.PoolRecord{}, err
	}
	attrs := poolAttrs(rec)
	setLastUsed := !rec.LastUsed.IsZero()
	for {
		e := newExpr()
		for _, f := range poolFields {
			if v, ok := attrs[f]; ok {
				e.Set(f, v)
			} else {
				e.Remove(f)
			}
		}
		if rec.State != "" {
			e.Set(fState, avS(string(rec.State)))
		}
		e.Set(fVersion, avN(rec.Version+1))
		cond := e.n(fVersion) + " = " + e.v(avN(rec.Version)) + " AND " + e.n(fClass) + " = " + e.v(avS(rec.Class))
		if rec.State == warmpool.PoolEnded {
			cond += " AND " + e.n(fState) + " = " + e.v(avS(string(warmpool.PoolEnded)))
		}
		if setLastUsed {
			at := avTime(rec.LastUsed)
			e.Set(fLastUsed, at)
			cond += " AND (attribute_not_exists(" + e.n(fLastUsed) + ") OR " + e.n(fLastUsed) + " <= " + e.v(at) + ")"
		}
		out, err := s.db.updateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: ptr(s.cfg.TasksTable), Key: key(poolPK(rec.Name)), UpdateExpression: e.update(),
			ConditionExpression: &cond, ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
			ReturnValues: types.ReturnValueAllNew, ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		if err == nil {
			got, err := decodePool(out.Attributes)
			if err != nil {
				return warmpool.PoolRecord{}, fmt.Errorf("update pool %s: %w", rec.Name, err)
			}
			return got, nil
		}
		old, failed := isConditionFailed(err)
		if !failed {
			return warmpool.PoolRecord{}, translate(action, err)
		}
		stored, err := s.storedPool(ctx, action, rec.Name, old)
		if err != nil {
			return warmpool.PoolRecord{}, err
		}
		switch {
		case stored.Version != rec.Version:
			return warmpool.PoolRecord{}, fmt.Errorf("update pool %s: at version %d, not %d: %w", rec.Name, stored.Version, rec.Version, warmpool.ErrConflict)
		case stored.Class != rec.Class:
			return warmpool.PoolRecord{}, fmt.Errorf("update pool %s: its class cannot change from %q to %q", rec.Name, stored.Class, rec.Class)
		case rec.State == warmpool.PoolEnded && stored.State != warmpool.PoolEnded:
			return warmpool.PoolRecord{}, fmt.Errorf("update pool %s: UpdatePool cannot end a pool (EndPool does)", rec.Name)
		case setLastUsed && stored.LastUsed.After(rec.LastUsed):
			setLastUsed = false // the stored one is the later: keep it
		default: // it changed between the write and the read
			return warmpool.PoolRecord{}, fmt.Errorf("update pool %s: %w", rec.Name, warmpool.ErrConflict)
		}
	}
}

// storedPool decodes old, a pool item a failed condition returned, or
// reads it when the failure returned none. ErrNotFound when there is no
// record.
func (s *Store) storedPool(ctx context.Context, action, name string, old item) (warmpool.PoolRecord, error) {
	if len(old) == 0 { // absent, or an emulator without ReturnValuesOnConditionCheckFailure: read it
		var err error
		if old, err = s.getItem(ctx, s.cfg.TasksTable, poolPK(name)); err != nil {
			return warmpool.PoolRecord{}, translate(action, err)
		}
		if old == nil {
			return warmpool.PoolRecord{}, fmt.Errorf("%s %s: %w", action, name, warmpool.ErrNotFound)
		}
	}
	rec, err := decodePool(old)
	if err != nil {
		return warmpool.PoolRecord{}, fmt.Errorf("%s %s: %w", action, name, err)
	}
	return rec, nil
}

// TouchPool implements warmpool.PoolStore. DynamoDB has no max(), so the
// write is one UpdateItem (ADD acquires, SET last_used = at) on the
// condition that the record exists and last_used is not later than at;
// when at is older (a batch that arrived late), that write fails and a
// second one adds the acquires alone: 1 call, 2 for an older at. Neither
// reads, and the version is left alone.
func (s *Store) TouchPool(ctx context.Context, name string, at time.Time, n int) error {
	const action = "touch pool"
	if err := s.begin(ctx, action); err != nil {
		return err
	}
	touch := func(setLastUsed bool) error {
		e := newExpr()
		e.Add(fAcquires, avN(int64(n)))
		cond := "attribute_exists(" + e.n(attrPK) + ")"
		if setLastUsed {
			v := avTime(at)
			e.Set(fLastUsed, v)
			cond += " AND (attribute_not_exists(" + e.n(fLastUsed) + ") OR " + e.n(fLastUsed) + " <= " + e.v(v) + ")"
		}
		_, err := s.db.updateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: ptr(s.cfg.TasksTable), Key: key(poolPK(name)), UpdateExpression: e.update(),
			ConditionExpression: &cond, ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
		})
		return err
	}
	if !at.IsZero() {
		err := touch(true)
		if _, failed := isConditionFailed(err); !failed {
			return translate(action, err)
		}
	}
	err := touch(false)
	if _, failed := isConditionFailed(err); failed {
		return fmt.Errorf("touch pool %s: %w", name, warmpool.ErrNotFound)
	}
	return translate(action, err)
}

// EndPool implements warmpool.PoolStore: one TransactWriteItems of the
// record's update (version, active → ended, ended_at), conditional on its
// version and state, and a ConditionCheck of each of the pool's
// Config.Shards capacity counter items (n absent or 0), then one GetItem
// to return the record as stored (2 calls). ErrConflict when any condition
// fails, ErrNotFound when there is no record.
func (s *Store) EndPool(ctx context.Context, rec warmpool.PoolRecord, now time.Time) (warmpool.PoolRecord, error) {
	const action = "end pool"
	if err := s.begin(ctx, action); err != nil {
		return warmpool.PoolRecord{}, err
	}
	items := endPoolItems(s.cfg, rec, now)
	for round := 0; round < maxRounds; round++ {
		_, err := s.db.transact(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items, ClientRequestToken: requestToken()})
		if err == nil {
			return s.endedPool(ctx, rec, now), nil
		}
		reasons, ok := cancelReasons(err)
		if !ok {
			return warmpool.PoolRecord{}, translate(action, err)
		}
		if reasonCode(reasons, 0) == reasonCondition {
			stored, err := s.storedPool(ctx, action, rec.Name, reasons[0].Item)
			switch {
			case err != nil:
				return warmpool.PoolRecord{}, err
			case stored.Version != rec.Version:
				return warmpool.PoolRecord{}, fmt.Errorf("end pool %s: at version %d, not %d: %w", rec.Name, stored.Version, rec.Version, warmpool.ErrConflict)
			default:
				return warmpool.PoolRecord{}, fmt.Errorf("end pool %s: it is %s, not active: %w", rec.Name, stored.State, warmpool.ErrConflict)
			}
		}
		for i := 1; i < len(items); i++ {
			if reasonCode(reasons, i) == reasonCondition {
				return warmpool.PoolRecord{}, fmt.Errorf("end pool %s: tasks of the pool are counted (capacity shard %d): %w", rec.Name, i-1, warmpool.ErrConflict)
			}
		}
		switch retry, throttled := retryableReasons(reasons); {
		case throttled:
			return warmpool.PoolRecord{}, fmt.Errorf("end pool %s: %w: %w", rec.Name, warmpool.ErrUnavailable, err)
		case !retry:
			return warmpool.PoolRecord{}, translate(action, err)
		}
		if err := backoff(ctx, round); err != nil {
			return warmpool.PoolRecord{}, translate(action, err)
		}
	}
	return warmpool.PoolRecord{}, fmt.Errorf("end pool %s: lost %d races in a row: %w", rec.Name, maxRounds, warmpool.ErrUnavailable)
}

// endPoolItems is EndPool's transaction: the record's update (item 0),
// then the check of each capacity shard of the pool (item 1+i: shard i).
func endPoolItems(cfg Config, rec warmpool.PoolRecord, now time.Time) []types.TransactWriteItem {
	e := newExpr()
	e.Set(fState, avS(string(warmpool.PoolEnded)))
	e.Set(fVersion, avN(rec.Version+1))
	if now.IsZero() {
		e.Remove(fEndedAt)
	} else {
		e.Set(fEndedAt, avTime(now))
	}
	cond := e.n(fVersion) + " = " + e.v(avN(rec.Version)) + " AND " + e.n(fState) + " = " + e.v(avS(string(warmpool.PoolActive)))
	items := make([]types.TransactWriteItem, 0, 1+cfg.Shards)
	items = append(items, types.TransactWriteItem{Update: &types.Update{
		TableName: ptr(cfg.TasksTable), Key: key(poolPK(rec.Name)), UpdateExpression: e.update(),
		ConditionExpression: &cond, ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}})
	for i := range cfg.Shards {
		e := newExpr()
		cond := "attribute_not_exists(" + e.n(attrCapN) + ") OR " + e.n(attrCapN) + " = " + e.v(avN(0))
		items = append(items, types.TransactWriteItem{ConditionCheck: &types.ConditionCheck{
			TableName: ptr(cfg.TasksTable), Key: key(capPK(rec.Name, i)), ConditionExpression: &cond,
			ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
		}})
	}
	return items
}

// endedPool is the record EndPool ended, as stored: read back (a
// transaction returns no item), or, when that read fails or finds the
// record changed again since, rec as ended (its Acquires and LastUsed
// then those of the caller's copy).
func (s *Store) endedPool(ctx context.Context, rec warmpool.PoolRecord, now time.Time) warmpool.PoolRecord {
	out := rec
	out.State, out.EndedAt, out.Version = warmpool.PoolEnded, now, rec.Version+1
	if it, err := s.getItem(ctx, s.cfg.TasksTable, poolPK(rec.Name)); err == nil && it != nil {
		if got, err := decodePool(it); err == nil && got.Version == out.Version {
			return got
		}
	}
	return out
}

// DeletePool implements warmpool.PoolStore: one DeleteItem conditional on
// the version and the state (ended); ALL_OLD on failure tells a missing
// record (nil) from ErrConflict.
func (s *Store) DeletePool(ctx context.Context, rec warmpool.PoolRecord) error {
	const action = "delete pool"
	if err := s.begin(ctx, action); err != nil {
		return err
	}
	e := newExpr()
	cond := e.n(fVersion) + " = " + e.v(avN(rec.Version)) + " AND " + e.n(fState) + " = " + e.v(avS(string(warmpool.PoolEnded)))
	_, err := s.db.deleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: ptr(s.cfg.TasksTable), Key: key(poolPK(rec.Name)), ConditionExpression: &cond,
		ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	old, failed := isConditionFailed(err)
	if !failed {
		return translate(action, err)
	}
	stored, err := s.storedPool(ctx, action, rec.Name, old)
	switch {
	case errors.Is(err, warmpool.ErrNotFound):
		return nil
	case err != nil:
		return err
	case stored.Version != rec.Version:
		return fmt.Errorf("delete pool %s: at version %d, not %d: %w", rec.Name, stored.Version, rec.Version, warmpool.ErrConflict)
	}
	return fmt.Errorf("delete pool %s: it is %s, not ended: %w", rec.Name, stored.State, warmpool.ErrConflict)
}

// GetPool implements warmpool.PoolStore: one strongly consistent GetItem.
func (s *Store) GetPool(ctx context.Context, name string) (warmpool.PoolRecord, error) {
	const action = "get pool"
	if err := s.begin(ctx, action); err != nil {
		return warmpool.PoolRecord{}, err
	}
	it, err := s.getItem(ctx, s.cfg.TasksTable, poolPK(name))
	if err != nil {
		return warmpool.PoolRecord{}, translate(action, err)
	}
	if it == nil {
		return warmpool.PoolRecord{}, fmt.Errorf("get pool %s: %w", name, warmpool.ErrNotFound)
	}
	rec, err := decodePool(it)
	if err != nil {
		return warmpool.PoolRecord{}, fmt.Errorf("get pool %s: %w", name, err)
	}
	return rec, nil
}

// ListPoolsPage implements warmpool.PoolStore. For a class it walks the
// class's shards of tasks-by-pool as ListTasksPage walks a pool's (keys
// only; the cursor is "<shard>/<pk>") and reads the records with one
// strongly consistent BatchGetItem: S Query at most + 1 BatchGetItem a
// page. For every class ("") it scans the table for pool records
// (operators: at most scanPoolCalls Scan calls of limit items a page;
// the cursor is the last key read), so a page may hold fewer than limit
// records before the walk ends.
func (s *Store) ListPoolsPage(ctx context.Context, class, cursor string, limit int) (warmpool.PoolPage, error) {
	const action = "list pools page"
	if err := warmpool.CheckPage(limit); err != nil {
		return warmpool.PoolPage{}, err
	}
	if err := s.begin(ctx, action); err != nil {
		return warmpool.PoolPage{}, err
	}
	limit = min(limit, batchGetMax)
	if class == "" {
		return s.scanPools(ctx, cursor, limit)
	}
	recs, next, err := indexRecords(ctx, s, func(shard int) string { return poolIndexKey(class, shard) }, prefixPool, cursor, limit,
		decodePool, func(rec warmpool.PoolRecord) bool { return rec.Class == class })
	if err != nil {
		return warmpool.PoolPage{}, fmt.Errorf("%s: %w", action, err)
	}
	return warmpool.PoolPage{Pools: recs, Next: next}, nil
}

// scanPools is one page of a scan of every pool record.
func (s *Store) scanPools(ctx context.Context, cursor string, limit int) (warmpool.PoolPage, error) {
	const action = "list pools page"
	e := newExpr()
	filter := "begins_with(" + e.n(attrPK) + ", " + e.v(avS(prefixPool)) + ")"
	in := &dynamodb.ScanInput{TableName: ptr(s.cfg.TasksTable), ConsistentRead: ref(true), FilterExpression: &filter,
		Limit: ref(int32(limit)), ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values()}
	if cursor != "" {
		in.ExclusiveStartKey = key(cursor)
	}
	var page warmpool.PoolPage
	last := ""
	for calls := 1; ; calls++ {
		out, err := s.db.scan(ctx, in)
		if err != nil {
			return warmpool.PoolPage{}, translate(action, err)
		}
		for _, it := range out.Items {
			if len(page.Pools) == limit { // more than a page: go on after the last one taken
				page.Next = last
				return page, nil
			}
			rec, err := decodePool(it)
			if err != nil {
				return warmpool.PoolPage{}, fmt.Errorf("list pools page: %w", err)
			}
			page.Pools, last = append(page.Pools, rec), pkOf(it)
		}
		if len(out.LastEvaluatedKey) == 0 {
			return page, nil
		}
		page.Next = pkOf(out.LastEvaluatedKey)
		if len(page.Pools) == limit || calls == scanPoolCalls {
			return page, nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// ReserveClassTasks implements warmpool.PoolStore: ReserveTasks's
// transaction plus a ConditionCheck of the pool's record (active, of the
// class) and updates of the class's counter shards (each within its
// quota of classMax, placed as the pool's capacity is), all in one
// TransactWriteItems; each record carries its class and the class shard
// that counts it. A refusal of the check is ErrNoCapacity (no record, or
// not active) or an error (another class); like ReserveTasks, it sets
// each record's Class.
func (s *Store) ReserveClassTasks(ctx context.Context, class string, classMax int, pool string, maxTotal int, recs []warmpool.TaskRecord) error {
	if err := warmpool.CheckReserveClass(class, classMax, pool, recs); err != nil {
		return err
	}
	for i := range recs {
		recs[i].Class = class
	}
	c := newShardedCount(fmt.Sprintf("class %q", class), classMax, func(i int) string { return classCapPK(class, i) })
	c.class = class
	return s.reserve(ctx, pool, maxTotal, recs, c)
}

// poolCheck is the item of a class reservation that checks the pool's
// record: it exists, is active and is of the class.
func poolCheck(cfg Config, pool string, class *shardedCount) types.TransactWriteItem {
	e := newExpr()
	cond := e.n(fState) + " = " + e.v(avS(string(warmpool.PoolActive))) + " AND " + e.n(fClass) + " = " + e.v(avS(class.class))
	return types.TransactWriteItem{ConditionCheck: &types.ConditionCheck{
		TableName: ptr(cfg.TasksTable), Key: key(poolPK(pool)), ConditionExpression: &cond,
		ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}}
}

// poolRefused reads why a reservation's check of the pool's record failed
// (old: the record it returned): ErrNoCapacity when there is none or it
// is not active, an error when it is of another class, and retry when
// the record read now passes (it became active since).
func (s *Store) poolRefused(ctx context.Context, pool string, class *shardedCount, old item) (retry bool, err error) {
	rec, err := s.storedPool(ctx, "reserve tasks: pool", pool, old)
	switch {
	case errors.Is(err, warmpool.ErrNotFound):
		return false, fmt.Errorf("reserve tasks: pool %q has no record: %w", pool, warmpool.ErrNoCapacity)
	case err != nil:
		return false, err
	case rec.Class != class.class:
		return false, fmt.Errorf("reserve tasks: pool %q is of class %q, not %q", pool, rec.Class, class.class)
	case rec.State != warmpool.PoolActive:
		return false, fmt.Errorf("reserve tasks: pool %q is %s, not active: %w", pool, rec.State, warmpool.ErrNoCapacity)
	}
	return true, nil
}

// CountClass implements warmpool.PoolStore: one BatchGetItem of the
// class's counter shards, summed.
func (s *Store) CountClass(ctx context.Context, class string) (int, error) {
	const action = "count class"
	if err := s.begin(ctx, action); err != nil {
		return 0, err
	}
	shards, err := s.readShards(ctx, func(i int) string { return classCapPK(class, i) })
	if err != nil {
		return 0, translate(action, err)
	}
	var n int64
	for _, sh := range shards {
		n += sh.n
	}
	return int(n), nil
}
