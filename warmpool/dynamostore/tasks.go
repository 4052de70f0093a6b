package dynamostore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"golang.org/x/sync/errgroup"

	"github.com/quarryhq/quarry/warmpool"
)

// MaxReserve is how many records one ReserveTasks call may create with
// shards capacity shards: they and the counters they touch must fit in one
// transaction (100 items).
func MaxReserve(shards int) int { return maxTransactItems - shards }

// MaxReserve implements warmpool.ReserveLimiter: MaxReserve(Config.Shards).
func (s *Store) MaxReserve() int { return MaxReserve(s.cfg.Shards) }

var _ warmpool.ReserveLimiter = (*Store)(nil)

// ReserveTasks implements warmpool.TaskStore: all or none, within
// maxTotal across every replica. The pool's capacity is counted in
// Config.Shards counter items, each allowed its share of maxTotal; one
// transaction creates the records (attribute_not_exists) and increments
// the counters it uses (on the condition that they stay within their
// share), and the launching count of each record's own shard (the shard
// its id hashes to). The first try counts each record in its own shard
// without reading (so that DeleteTask later finds it there); when a share
// is full it reads every counter (one BatchGetItem) and moves the records
// that do not fit to the shards with room. It returns ErrNoCapacity when
// the shares together have less room than len(recs), ErrConflict when an
// id exists, and an error when len(recs) exceeds MaxReserve(Config.Shards).
func (s *Store) ReserveTasks(ctx context.Context, pool string, maxTotal int, recs []warmpool.TaskRecord) error {
	const action = "reserve tasks"
	if err := warmpool.CheckReserve(pool, recs); err != nil {
		return err
	}
	if len(recs) == 0 {
		return nil
	}
	if n := MaxReserve(s.cfg.Shards); len(recs) > n {
		return fmt.Errorf("reserve tasks: %d records in one call; the DynamoDB store reserves at most %d at once (one transaction)", len(recs), n)
	}
	if err := s.begin(ctx, action); err != nil {
		return err
	}
	quota := quotas(maxTotal, s.cfg.Shards)
	own := make([]int, len(recs))
	for i, r := range recs {
		own[i] = shardOf(r.ID, s.cfg.Shards)
	}
	full := func(counts []int64) error {
		var n int64
		for _, c := range counts {
			n += c
		}
		return fmt.Errorf("pool %q has %d of max_total %d tasks, %d more do not fit: %w", pool, n, maxTotal, len(recs), warmpool.ErrNoCapacity)
	}
	if sum(quota) < int64(len(recs)) {
		return full(make([]int64, s.cfg.Shards))
	}
	var counts []int64 // nil until read
	for round := 0; round < maxRounds; round++ {
		cshards := assignShards(quota, counts, own, randIntN(s.cfg.Shards))
		if cshards == nil {
			if counts == nil {
				var err error
				if counts, err = s.readCapacity(ctx, pool); err != nil {
					return translate(action, err)
				}
				cshards = assignShards(quota, counts, own, randIntN(s.cfg.Shards))
			}
			if cshards == nil {
				return full(counts)
			}
		}
		items := reserveItems(s.cfg, pool, recs, quota, own, cshards)
		_, err := s.db.transact(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items, ClientRequestToken: requestToken()})
		if err == nil {
			return nil
		}
		reasons, ok := cancelReasons(err)
		if !ok {
			return translate(action, err)
		}
		counterFull := false
		for i := range items {
			if reasonCode(reasons, i) != reasonCondition {
				continue
			}
			if items[i].Put != nil {
				return fmt.Errorf("reserve tasks: task %s exists already: %w", recs[i].ID, warmpool.ErrConflict)
			}
			counterFull = true
		}
		switch retry, _ := retryableReasons(reasons); {
		case counterFull:
			if round > 0 {
				if err := backoff(ctx, round); err != nil {
					return translate(action, err)
				}
			}
			var rerr error // another reservation took the room: read again
			if counts, rerr = s.readCapacity(ctx, pool); rerr != nil {
				return translate(action, rerr)
			}
		case retry:
			if err := backoff(ctx, round); err != nil {
				return translate(action, err)
			}
		default:
			return translate(action, err)
		}
	}
	return fmt.Errorf("reserve tasks in pool %q: lost %d races in a row: %w", pool, maxRounds, warmpool.ErrUnavailable)
}

func sum(v []int64) int64 {
	var n int64
	for _, x := range v {
		n += x
	}
	return n
}

// reserveItems builds the transaction of a reservation: one Put per record
// (first, in order, so that reason i names recs[i]) and one update per
// counter item touched: the capacity it takes (conditional on its quota)
// and the launching tasks whose ids hash to it.
func reserveItems(cfg Config, pool string, recs []warmpool.TaskRecord, quota []int64, own, cshards []int) []types.TransactWriteItem {
	items := make([]types.TransactWriteItem, 0, len(recs)+cfg.Shards)
	capacity := make([]int64, cfg.Shards)
	launching := make([]int64, cfg.Shards)
	for i, r := range recs {
		r.Pool = pool
		r.State = warmpool.TaskLaunching
		r.Version = 1
		capacity[cshards[i]]++
		launching[own[i]]++
		e := newExpr()
		cond := "attribute_not_exists(" + e.n(attrPK) + ")"
		items = append(items, types.TransactWriteItem{Put: &types.Put{
			TableName: ptr(cfg.TasksTable), Item: taskItem(r, cfg.Shards, cshards[i]), ConditionExpression: &cond,
			ExpressionAttributeNames: e.Names(),
		}})
	}
	for i := range cfg.Shards {
		a, l := capacity[i], launching[i]
		if a == 0 && l == 0 {
			continue
		}
		e := newExpr()
		var cond *string
		if a > 0 {
			e.Add(attrCapN, avN(a))
			c := "attribute_not_exists(" + e.n(attrCapN) + ") OR " + e.n(attrCapN) + " <= " + e.v(avN(quota[i]-a))
			cond = &c
		}
		if l > 0 {
			e.Add(countAttr(string(warmpool.TaskLaunching)), avN(l))
		}
		items = append(items, types.TransactWriteItem{Update: &types.Update{
			TableName: ptr(cfg.TasksTable), Key: key(capPK(pool, i)), UpdateExpression: e.update(),
			ConditionExpression: cond, ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
		}})
	}
	return items
}

// countUpdate is the transaction item that moves one task of pool (id
// hashing to its shard) from state from to state to in the counts; nil
// when nothing moves.
func countUpdate(cfg Config, pool, id string, from, to warmpool.TaskState) *types.TransactWriteItem {
	if from == to {
		return nil
	}
	e := newExpr()
	if from != "" {
		e.Add(countAttr(string(from)), avN(-1))
	}
	if to != "" {
		e.Add(countAttr(string(to)), avN(1))
	}
	return &types.TransactWriteItem{Update: &types.Update{
		TableName: ptr(cfg.TasksTable), Key: key(capPK(pool, shardOf(id, cfg.Shards))), UpdateExpression: e.update(),
		ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
	}}
}

// counterItems reads the pool's counter items (strongly consistent), by
// shard; a missing item is nil.
func (s *Store) counterItems(ctx context.Context, pool string) ([]item, error) {
	pks := make([]string, s.cfg.Shards)
	for i := range pks {
		pks[i] = capPK(pool, i)
	}
	got, err := s.batchGet(ctx, s.cfg.TasksTable, pks)
	if err != nil {
		return nil, err
	}
	out := make([]item, s.cfg.Shards)
	for i, pk := range pks {
		out[i] = got[pk]
	}
	return out, nil
}

// readCapacity reads the tasks each capacity shard of the pool counts.
func (s *Store) readCapacity(ctx context.Context, pool string) ([]int64, error) {
	items, err := s.counterItems(ctx, pool)
	if err != nil {
		return nil, err
	}
	counts := make([]int64, len(items))
	for i, it := range items {
		d := decoder{it: it}
		counts[i] = d.n(attrCapN)
		if d.err != nil {
			return nil, fmt.Errorf("capacity counter %s: %w", capPK(pool, i), d.err)
		}
	}
	return counts, nil
}

// countStates are the states the counter items count.
var countStates = []warmpool.TaskState{warmpool.TaskLaunching, warmpool.TaskReady, warmpool.TaskLeased, warmpool.TaskStopping}

// CountTasks implements warmpool.TaskStore: one BatchGetItem of the pool's
// counter items, summed over the shards.
func (s *Store) CountTasks(ctx context.Context, pool string) (warmpool.TaskCounts, error) {
	const action = "count tasks"
	if err := s.begin(ctx, action); err != nil {
		return warmpool.TaskCounts{}, err
	}
	items, err := s.counterItems(ctx, pool)
	if err != nil {
		return warmpool.TaskCounts{}, translate(action, err)
	}
	var c warmpool.TaskCounts
	for i, it := range items {
		d := decoder{it: it}
		for _, st := range countStates {
			c.Add(st, int(d.n(countAttr(string(st)))))
		}
		if d.err != nil {
			return warmpool.TaskCounts{}, fmt.Errorf("count tasks: counter %s: %w", capPK(pool, i), d.err)
		}
	}
	return c, nil
}

// UpdateTask implements warmpool.TaskStore: one UpdateItem conditional on
// the stored version, pool and state; a change of state is a
// TransactWriteItems of the record and the counter item of its id's shard.
// It keeps the ready index in step: a task entering ready gets a random
// place in its shard, one leaving it loses it.
func (s *Store) UpdateTask(ctx context.Context, rec warmpool.TaskRecord, from warmpool.TaskState) (warmpool.TaskRecord, error) {
	const action = "update task"
	if err := warmpool.CheckUpdate(rec, from); err != nil {
		return warmpool.TaskRecord{}, err
	}
	if rec.Pool == "" {
		return warmpool.TaskRecord{}, fmt.Errorf("update task %s: pool is empty", rec.ID)
	}
	if err := s.begin(ctx, action); err != nil {
		return warmpool.TaskRecord{}, err
	}
	next := rec
	next.Version++
	attrs := taskAttrs(next)
	e := newExpr()
	for _, f := range taskFields {
		if v, ok := attrs[f]; ok {
			e.Set(f, v)
		} else {
			e.Remove(f)
		}
	}
	if rec.State == warmpool.TaskReady {
		e.Set(attrReadyPK, avS(shardKey(rec.Pool, shardOf(rec.ID, s.cfg.Shards))))
		e.Set(attrReadySK, avN(randSortKey()))
	} else {
		e.Remove(attrReadyPK, attrReadySK)
	}
	cond := e.n(fVersion) + " = " + e.v(avN(rec.Version)) + " AND " + e.n(fPool) + " = " + e.v(avS(rec.Pool)) +
		" AND " + e.n(fState) + " = " + e.v(avS(string(from)))
	refused := func(old item) error {
		if len(old) == 0 {
			return fmt.Errorf("update task %s: %w", rec.ID, warmpool.ErrNotFound)
		}
		stored, derr := decodeTask(old)
		switch {
		case derr != nil:
			return fmt.Errorf("update task %s: %w", rec.ID, derr)
		case stored.Pool != rec.Pool:
			return fmt.Errorf("update task %s: pool cannot change from %q to %q", rec.ID, stored.Pool, rec.Pool)
		}
		return fmt.Errorf("update task %s: at version %d in state %s, not %d in %s: %w", rec.ID, stored.Version, stored.State, rec.Version, from, warmpool.ErrConflict)
	}
	upd := types.Update{
		TableName: ptr(s.cfg.TasksTable), Key: key(taskPK(rec.ID)), UpdateExpression: e.update(),
		ConditionExpression: &cond, ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	counter := countUpdate(s.cfg, rec.Pool, rec.ID, from, rec.State)
	if counter == nil {
		_, err := s.db.updateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: upd.TableName, Key: upd.Key, UpdateExpression: upd.UpdateExpression, ConditionExpression: upd.ConditionExpression,
			ExpressionAttributeNames: upd.ExpressionAttributeNames, ExpressionAttributeValues: upd.ExpressionAttributeValues,
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		if old, ok := isConditionFailed(err); ok {
			return warmpool.TaskRecord{}, refused(old)
		}
		if err != nil {
			return warmpool.TaskRecord{}, translate(action, err)
		}
		return next, nil
	}
	items := []types.TransactWriteItem{{Update: &upd}, *counter}
	for round := 0; round < maxRounds; round++ {
		_, err := s.db.transact(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items, ClientRequestToken: requestToken()})
		if err == nil {
			return next, nil
		}
		reasons, ok := cancelReasons(err)
		if !ok {
			return warmpool.TaskRecord{}, translate(action, err)
		}
		if reasonCode(reasons, 0) == reasonCondition {
			old := reasons[0].Item
			if len(old) == 0 { // an emulator without ReturnValuesOnConditionCheckFailure: read it
				if old, err = s.getItem(ctx, s.cfg.TasksTable, taskPK(rec.ID)); err != nil {
					return warmpool.TaskRecord{}, translate(action, err)
				}
			}
			return warmpool.TaskRecord{}, refused(old)
		}
		switch retry, throttled := retryableReasons(reasons); {
		case throttled:
			return warmpool.TaskRecord{}, fmt.Errorf("update task %s: %w: %w", rec.ID, warmpool.ErrUnavailable, err)
		case !retry:
			return warmpool.TaskRecord{}, translate(action, err)
		}
		if err := backoff(ctx, round); err != nil {
			return warmpool.TaskRecord{}, translate(action, err)
		}
	}
	return warmpool.TaskRecord{}, fmt.Errorf("update task %s: lost %d races in a row: %w", rec.ID, maxRounds, warmpool.ErrUnavailable)
}

// DeleteTask implements warmpool.TaskStore: one transaction deletes the
// record (conditional on what it expects of it) and takes it off its
// counters. The first try expects rec.State (stopping when unset) and the
// capacity shard of its own id, where ReserveTasks counts a record when
// that shard has room, so it needs no read; when the record differs, the
// transaction fails with the record as stored, and the next try expects
// exactly that (its version, state and capacity shard). Deleting an
// unknown id returns nil.
func (s *Store) DeleteTask(ctx context.Context, rec warmpool.TaskRecord) error {
	const action = "delete task"
	if err := warmpool.CheckDelete(rec); err != nil {
		return err
	}
	if err := s.begin(ctx, action); err != nil {
		return err
	}
	id := rec.ID
	want := struct {
		pool    string
		state   warmpool.TaskState
		cshard  int64
		version int64 // 0: any
	}{pool: rec.Pool, state: rec.State, cshard: int64(shardOf(id, s.cfg.Shards))}
	if want.state == "" {
		want.state = warmpool.TaskStopping
	}
	for round := 0; round < maxRounds; round++ {
		e := newExpr()
		cond := e.n(fPool) + " = " + e.v(avS(want.pool)) + " AND " + e.n(fState) + " = " + e.v(avS(string(want.state)))
		if want.version > 0 {
			cond += " AND " + e.n(fVersion) + " = " + e.v(avN(want.version))
		}
		if want.cshard >= 0 {
			cond += " AND " + e.n(attrCShard) + " = " + e.v(avN(want.cshard))
		} else {
			cond += " AND attribute_not_exists(" + e.n(attrCShard) + ")"
		}
		items := []types.TransactWriteItem{{Delete: &types.Delete{
			TableName: ptr(s.cfg.TasksTable), Key: key(taskPK(id)), ConditionExpression: &cond,
			ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		}}}
		items = append(items, deleteCounters(s.cfg, want.pool, id, want.state, want.cshard)...)
		_, err := s.db.transact(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items, ClientRequestToken: requestToken()})
		if err == nil {
			return nil
		}
		reasons, ok := cancelReasons(err)
		if !ok {
			return translate(action, err)
		}
		if reasonCode(reasons, 0) == reasonCondition {
			old := reasons[0].Item
			if len(old) == 0 { // gone, or an emulator that does not return it: read
				if old, err = s.getItem(ctx, s.cfg.TasksTable, taskPK(id)); err != nil || old == nil {
					return translate(action, err)
				}
			}
			d := decoder{it: old}
			want.pool, want.state, want.version = d.s(fPool), warmpool.TaskState(d.s(fState)), d.n(fVersion)
			want.cshard = -1
			if _, ok := old[attrCShard]; ok {
				want.cshard = d.n(attrCShard)
			}
			if d.err != nil {
				return fmt.Errorf("delete task %s: %w", id, d.err)
			}
			continue // expect the record as it is
		}
		retry, throttled := retryableReasons(reasons)
		switch {
		case throttled:
			return fmt.Errorf("delete task %s: %w: %w", id, warmpool.ErrUnavailable, err)
		case !retry:
			return translate(action, err)
		}
		if err := backoff(ctx, round); err != nil {
			return translate(action, err)
		}
	}
	return fmt.Errorf("delete task %s: lost %d races in a row: %w", id, maxRounds, warmpool.ErrUnavailable)
}

// deleteCounters are the counter updates of deleting a task of pool in
// state counted in capacity shard cshard (-1: none): capacity -1 there,
// the state's count -1 in the shard of its id; one item when both are the
// same shard.
func deleteCounters(cfg Config, pool, id string, state warmpool.TaskState, cshard int64) []types.TransactWriteItem {
	own := shardOf(id, cfg.Shards)
	var out []types.TransactWriteItem
	update := func(shard int, capacity, count bool) {
		e := newExpr()
		if capacity {
			e.Add(attrCapN, avN(-1))
		}
		if count {
			e.Add(countAttr(string(state)), avN(-1))
		}
		out = append(out, types.TransactWriteItem{Update: &types.Update{
			TableName: ptr(cfg.TasksTable), Key: key(capPK(pool, shard)), UpdateExpression: e.update(),
			ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
		}})
	}
	validShard := cshard >= 0 && int(cshard) < cfg.Shards
	switch {
	case validShard && int(cshard) == own:
		update(own, true, true)
	case validShard:
		update(int(cshard), true, false)
		update(own, false, true)
	default:
		update(own, false, true)
	}
	return out
}

// ListTasks implements warmpool.TaskStore, oldest first. For a pool it
// queries every shard of the tasks-by-pool index (keys only) and reads the
// records with strongly consistent BatchGetItem, so states are current
// (only a task created in the last moment may be missing, while the index
// catches up). For every pool it scans the table.
func (s *Store) ListTasks(ctx context.Context, pool string) ([]warmpool.TaskRecord, error) {
	const action = "list tasks"
	if err := s.begin(ctx, action); err != nil {
		return nil, err
	}
	var items []item
	if pool == "" {
		var err error
		if items, err = s.scanAll(ctx, s.cfg.TasksTable, prefixTask); err != nil {
			return nil, translate(action, err)
		}
	} else {
		pks, err := s.shardKeys(ctx, s.cfg.TasksTable, indexTasksByPool, attrPoolPK, pool, nil)
		if err != nil {
			return nil, translate(action, err)
		}
		got, err := s.batchGet(ctx, s.cfg.TasksTable, pks)
		if err != nil {
			return nil, translate(action, err)
		}
		for _, it := range got {
			items = append(items, it)
		}
	}
	out := make([]warmpool.TaskRecord, 0, len(items))
	for _, it := range items {
		rec, err := decodeTask(it)
		if err != nil {
			return nil, fmt.Errorf("list tasks: %w", err)
		}
		if pool == "" || rec.Pool == pool {
			out = append(out, rec)
		}
	}
	slices.SortFunc(out, func(a, b warmpool.TaskRecord) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// ListTasksPage implements warmpool.TaskStore. For a pool it walks the
// shards of tasks-by-pool one after another (keys only, Limit per query)
// and reads the records with one strongly consistent BatchGetItem; the
// cursor is the shard and the last key read ("<shard>/<pk>"). For every
// pool it scans the table (eventually consistent, Limit items a page); the
// cursor is the last pk scanned. A page may hold fewer than limit records
// before the walk ends (a scan page of counters and meta items).
func (s *Store) ListTasksPage(ctx context.Context, pool, cursor string, limit int) (warmpool.TaskPage, error) {
	const action = "list tasks page"
	if err := warmpool.CheckPage(limit); err != nil {
		return warmpool.TaskPage{}, err
	}
	if err := s.begin(ctx, action); err != nil {
		return warmpool.TaskPage{}, err
	}
	limit = min(limit, batchGetMax)
	if pool == "" {
		page, err := s.scanPage(ctx, cursor, limit)
		if err != nil {
			return warmpool.TaskPage{}, translate(action, err)
		}
		return page, nil
	}
	shard, after := 0, ""
	if cursor != "" {
		i := strings.IndexByte(cursor, '/')
		n, err := strconv.Atoi(cursor[:max(i, 0)])
		if i < 0 || err != nil || n < 0 || n >= s.cfg.Shards {
			return warmpool.TaskPage{}, fmt.Errorf("list tasks page: bad cursor %q", cursor)
		}
		shard, after = n, cursor[i+1:]
	}
	var pks []string
	next := ""
	for shard < s.cfg.Shards && len(pks) < limit {
		e := newExpr()
		cond := e.n(attrPoolPK) + " = " + e.v(avS(shardKey(pool, shard)))
		in := &dynamodb.QueryInput{TableName: ptr(s.cfg.TasksTable), IndexName: ptr(indexTasksByPool), KeyConditionExpression: &cond,
			ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(), Limit: ref(int32(limit - len(pks)))}
		if after != "" {
			in.ExclusiveStartKey = item{attrPK: avS(after), attrPoolPK: avS(shardKey(pool, shard))}
		}
		out, err := s.db.query(ctx, in)
		if err != nil {
			return warmpool.TaskPage{}, translate(action, err)
		}
		for _, it := range out.Items {
			pks = append(pks, pkOf(it))
		}
		if len(out.LastEvaluatedKey) > 0 {
			after = pkOf(out.LastEvaluatedKey)
			next = strconv.Itoa(shard) + "/" + after
			continue
		}
		shard, after = shard+1, ""
		next = ""
		if shard < s.cfg.Shards {
			next = strconv.Itoa(shard) + "/"
		}
	}
	got, err := s.batchGet(ctx, s.cfg.TasksTable, pks)
	if err != nil {
		return warmpool.TaskPage{}, translate(action, err)
	}
	page := warmpool.TaskPage{Next: next}
	for _, pk := range pks {
		it, ok := got[pk]
		if !ok {
			continue // deleted since the index listed it
		}
		rec, err := decodeTask(it)
		if err != nil {
			return warmpool.TaskPage{}, fmt.Errorf("list tasks page: %w", err)
		}
		if rec.Pool == pool {
			page.Tasks = append(page.Tasks, rec)
		}
	}
	return page, nil
}

// scanPage is one page of a scan of every task record.
func (s *Store) scanPage(ctx context.Context, cursor string, limit int) (warmpool.TaskPage, error) {
	e := newExpr()
	filter := "begins_with(" + e.n(attrPK) + ", " + e.v(avS(prefixTask)) + ")"
	in := &dynamodb.ScanInput{TableName: ptr(s.cfg.TasksTable), FilterExpression: &filter, Limit: ref(int32(limit)),
		ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values()}
	if cursor != "" {
		in.ExclusiveStartKey = key(cursor)
	}
	out, err := s.db.scan(ctx, in)
	if err != nil {
		return warmpool.TaskPage{}, err
	}
	var page warmpool.TaskPage
	for _, it := range out.Items {
		rec, err := decodeTask(it)
		if err != nil {
			return warmpool.TaskPage{}, err
		}
		page.Tasks = append(page.Tasks, rec)
	}
	if len(out.LastEvaluatedKey) > 0 {
		page.Next = pkOf(out.LastEvaluatedKey)
	}
	return page, nil
}

// shardQuery narrows one shard's query: a sort key condition (with its
// values) and the order and bound of the results.
type shardQuery struct {
	sortCond func(e *expr) string
	newest   bool
	limit    int
}

// shardKeys queries every shard "<prefix>#<i>" of index (partition key
// attribute hashAttr) concurrently and returns the
// table keys found, shard after shard.
func (s *Store) shardKeys(ctx context.Context, table, index, hashAttr, prefix string, q *shardQuery) ([]string, error) {
	var mu sync.Mutex
	per := make([][]string, s.cfg.Shards)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(fanOut)
	for i := range s.cfg.Shards {
		g.Go(func() error {
			e := newExpr()
			cond := e.n(hashAttr) + " = " + e.v(avS(shardKey(prefix, i)))
			in := dynamodb.QueryInput{TableName: &table, IndexName: &index}
			limit := 0
			if q != nil {
				if q.sortCond != nil {
					cond += " AND " + q.sortCond(e)
				}
				in.ScanIndexForward = ref(!q.newest)
				limit = q.limit
			}
			in.KeyConditionExpression = &cond
			in.ExpressionAttributeNames, in.ExpressionAttributeValues = e.Names(), e.Values()
			pks, err := s.queryKeys(gctx, in, limit)
			if err != nil {
				return err
			}
			mu.Lock()
			per[i] = pks
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	var out []string
	for _, p := range per {
		out = append(out, p...)
	}
	return out, nil
}

// GetTask implements warmpool.TaskStore: one strongly consistent GetItem.
// ErrNotFound when the task does not exist.
func (s *Store) GetTask(ctx context.Context, id string) (warmpool.TaskRecord, error) {
	const action = "get task"
	if err := s.begin(ctx, action); err != nil {
		return warmpool.TaskRecord{}, err
	}
	it, err := s.getItem(ctx, s.cfg.TasksTable, taskPK(id))
	if err != nil {
		return warmpool.TaskRecord{}, translate(action, err)
	}
	if it == nil {
		return warmpool.TaskRecord{}, fmt.Errorf("get task %s: %w", id, warmpool.ErrNotFound)
	}
	rec, err := decodeTask(it)
	if err != nil {
		return warmpool.TaskRecord{}, fmt.Errorf("get task %s: %w", id, err)
	}
	return rec, nil
}
