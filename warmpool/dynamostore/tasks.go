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

// MaxReserve is how many records one reservation may create with shards
// capacity shards. One transaction (100 items) holds the records, the
// pool's counter items they touch (at most two per record, the shard that
// counts its capacity and the shard of its id; at most shards in all)
// and, for an on-demand pool (ReserveClassTasks), the check of the pool's
// record and the class's counter items it touches (at most one per
// record, shards in all). Both kinds of reservation take the same limit:
// 83 records with 8 shards, 24 with 64.
func MaxReserve(shards int) int {
	k := maxTransactItems
	for k > 0 && k+min(shards, 2*k)+1+min(shards, k) > maxTransactItems {
		k--
	}
	return k
}

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
	if err := warmpool.CheckReserve(pool, recs); err != nil {
		return err
	}
	return s.reserve(ctx, pool, maxTotal, recs, nil)
}

// shardedCount is a sharded counter that a reservation counts its records
// in: a pool's capacity (cap#<pool>#i, within max_total) or a class's
// (ccap#<class>#i, within the class's total). Each shard item holds n
// (the tasks it counts), room (how many more it may count) and max (the
// total its room was stamped for). A stamp sets every shard's room and
// max in one transaction, conditional on no shard having grown since it
// was read, so that the rooms and the counts add up to the total at most;
// a reservation takes room from a shard only if that shard is stamped
// for the reservation's own total, and a delete gives its room back.
// So the total holds whatever totals the calls pass: a call with another
// total than the stamp's restamps first (when the counts leave room for
// its records) or is refused.
type shardedCount struct {
	what  string // `pool "p"` or `class "c"`, for errors
	class string // the class whose total it counts; "" for a pool's capacity
	max   int
	pk    func(shard int) string
	// read is the shards as last read (nil: not read); stale says that a
	// transaction found a shard without the room it was given.
	read  []counterShard
	stale bool
	// shards is the shard counting each record in this round's try (nil
	// before the first).
	shards []int
}

// counterShard is one shard of a sharded counter as read.
type counterShard struct {
	n, room, max int64
	stamped      bool // max is present
}

func newShardedCount(what string, maxTotal int, pk func(int) string) *shardedCount {
	return &shardedCount{what: what, max: maxTotal, pk: pk}
}

// counted is the tasks the shards count, as last read.
func (c *shardedCount) counted() int64 {
	var n int64
	for _, sh := range c.read {
		n += sh.n
	}
	return n
}

// full is the refusal of k more records by c, as last read.
func (c *shardedCount) full(k int) error {
	return fmt.Errorf("%s has %d of max_total %d tasks, %d more do not fit: %w", c.what, c.counted(), c.max, k, warmpool.ErrNoCapacity)
}

// place picks the shard counting each record (c.shards). The first try
// puts each record in its own shard without reading (the transaction's
// condition checks the room); a later try keeps the placement unless a
// transaction found this counter short (stale). Then it reads every
// shard: ErrNoCapacity when their counts and the records pass the total;
// otherwise it places the records by the shards' rooms, after a stamp
// (stamp) when the shards were stamped for another total, or for none, or
// their rooms hold too few for the counts (room lost to deletes that ran
// between a stamp's read and its write).
func (s *Store) place(ctx context.Context, c *shardedCount, own []int) error {
	const action = "reserve tasks"
	switch {
	case c.shards == nil && !c.stale:
		c.shards = own
		return nil
	case !c.stale:
		return nil
	}
	for round := 0; round < maxRounds; round++ {
		read, err := s.readShards(ctx, c.pk)
		if err != nil {
			return translate(action, err)
		}
		c.read, c.stale = read, false
		if c.counted()+int64(len(own)) > int64(c.max) {
			return c.full(len(own))
		}
		if stampedFor(read, c.max) {
			if c.shards = assignShards(rooms(read), make([]int64, len(read)), own, randIntN(len(read))); c.shards != nil {
				return nil
			}
		}
		items, stamped := stampItems(s.cfg, c)
		_, err = s.db.transact(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items, ClientRequestToken: requestToken()})
		if err == nil {
			c.read = stamped
			if c.shards = assignShards(rooms(stamped), make([]int64, len(stamped)), own, randIntN(len(stamped))); c.shards == nil {
				return fmt.Errorf("reserve tasks: %s: a stamp left no room for %d records", c.what, len(own)) // a bug: the stamp spreads the room left
			}
			return nil
		}
		reasons, ok := cancelReasons(err)
		if !ok {
			return translate(action, err)
		}
		retry, throttled := retryableReasons(reasons)
		switch {
		case throttled:
			return fmt.Errorf("reserve tasks: stamp %s: %w: %w", c.what, warmpool.ErrUnavailable, err)
		case !retry && !slices.ContainsFunc(reasons, func(r types.CancellationReason) bool { return r.Code != nil && *r.Code == reasonCondition }):
			return translate(action, err)
		}
		if err := backoff(ctx, round); err != nil { // a shard grew since the read, or a conflict: read again
			return translate(action, err)
		}
	}
	return fmt.Errorf("reserve tasks: stamp %s: lost %d races in a row: %w", c.what, maxRounds, warmpool.ErrUnavailable)
}

// stampedFor reports whether every shard was stamped for total max.
func stampedFor(read []counterShard, max int) bool {
	for _, sh := range read {
		if !sh.stamped || sh.max != int64(max) {
			return false
		}
	}
	return true
}

func rooms(read []counterShard) []int64 {
	out := make([]int64, len(read))
	for i, sh := range read {
		out[i] = sh.room
	}
	return out
}

// stampItems is the transaction that stamps c's shards for c.max from
// c.read: the room left (c.max minus the counts) spread over the shards
// (quotas), each shard on the condition that it counts no more than it
// did when read; and the shards as they are once it commits.
func stampItems(cfg Config, c *shardedCount) ([]types.TransactWriteItem, []counterShard) {
	free := quotas(c.max-int(c.counted()), len(c.read))
	items := make([]types.TransactWriteItem, 0, len(c.read))
	out := make([]counterShard, len(c.read))
	for i, sh := range c.read {
		out[i] = counterShard{n: sh.n, room: free[i], max: int64(c.max), stamped: true}
		e := newExpr()
		e.Set(attrCapMax, avN(int64(c.max)))
		e.Set(attrRoom, avN(free[i]))
		cond := "attribute_not_exists(" + e.n(attrCapN) + ") OR " + e.n(attrCapN) + " <= " + e.v(avN(sh.n))
		items = append(items, types.TransactWriteItem{Update: &types.Update{
			TableName: ptr(cfg.TasksTable), Key: key(c.pk(i)), UpdateExpression: e.update(),
			ConditionExpression: &cond, ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
		}})
	}
	return items, out
}

// reserve is ReserveTasks and, with class set, ReserveClassTasks: the
// same transaction plus the check of the pool's record (active, of the
// class) and the class's counter. It runs after the arguments' check.
func (s *Store) reserve(ctx context.Context, pool string, maxTotal int, recs []warmpool.TaskRecord, class *shardedCount) error {
	const action = "reserve tasks"
	if len(recs) == 0 {
		return nil
	}
	if n := MaxReserve(s.cfg.Shards); len(recs) > n {
		return fmt.Errorf("reserve tasks: %d records in one call; the DynamoDB store reserves at most %d at once (one transaction)", len(recs), n)
	}
	if err := s.begin(ctx, action); err != nil {
		return err
	}
	own := make([]int, len(recs))
	for i, r := range recs {
		own[i] = shardOf(r.ID, s.cfg.Shards)
	}
	counters := []*shardedCount{newShardedCount(fmt.Sprintf("pool %q", pool), maxTotal, func(i int) string { return capPK(pool, i) })}
	if class != nil {
		counters = append(counters, class)
	}
	for _, c := range counters {
		if c.max < len(recs) {
			return c.full(len(recs))
		}
	}
	for round := 0; round < maxRounds; round++ {
		for _, c := range counters {
			if err := s.place(ctx, c, own); err != nil {
				return err
			}
		}
		items, roles := reserveItems(s.cfg, pool, recs, own, counters)
		_, err := s.db.transact(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items, ClientRequestToken: requestToken()})
		if err == nil {
			return nil
		}
		reasons, ok := cancelReasons(err)
		if !ok {
			return translate(action, err)
		}
		short, recheck := false, false
		for i, role := range roles {
			if reasonCode(reasons, i) != reasonCondition {
				continue
			}
			switch {
			case role.pool:
				ok, err := s.poolRefused(ctx, pool, class, reasons[i].Item)
				if err != nil {
					return err
				}
				recheck = recheck || ok
			case role.counter == nil:
				return fmt.Errorf("reserve tasks: task %s exists already: %w", recs[i].ID, warmpool.ErrConflict)
			default:
				role.counter.stale, short = true, true // no room there (taken, or another stamp): read again
			}
		}
		retry, _ := retryableReasons(reasons)
		if !short && !recheck && !retry {
			return translate(action, err)
		}
		if short && round == 0 {
			continue
		}
		if err := backoff(ctx, round); err != nil {
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

// reserveRole says what one item of a reservation's transaction is, to
// read its cancellation reason: a record's Put (neither field set), the
// check of the pool's record, or an update of a counter's shard.
type reserveRole struct {
	pool    bool
	counter *shardedCount
}

// reserveItems builds the transaction of a reservation: one Put per record
// (first, in order, so that reason i names recs[i]), then one update per
// shard of the pool's counter touched (counters[0]: the capacity it takes,
// conditional on its quota, and the launching tasks whose ids hash to
// it), and for a class (counters[1]) the check that the pool's record is
// active and of the class, and one update per shard of the class's
// counter touched (conditional on its quota). Each counter's shards were
// placed (shardedCount.shards).
func reserveItems(cfg Config, pool string, recs []warmpool.TaskRecord, own []int, counters []*shardedCount) ([]types.TransactWriteItem, []reserveRole) {
	items := make([]types.TransactWriteItem, 0, len(recs)+2*cfg.Shards+1)
	roles := make([]reserveRole, 0, cap(items))
	capacity := counters[0]
	var class *shardedCount
	if len(counters) > 1 {
		class = counters[1]
	}
	for i, r := range recs {
		r.Pool = pool
		r.State = warmpool.TaskLaunching
		r.Version = 1
		gshard := -1
		if class != nil {
			gshard = class.shards[i]
		}
		e := newExpr()
		cond := "attribute_not_exists(" + e.n(attrPK) + ")"
		items = append(items, types.TransactWriteItem{Put: &types.Put{
			TableName: ptr(cfg.TasksTable), Item: taskItem(r, cfg.Shards, capacity.shards[i], gshard), ConditionExpression: &cond,
			ExpressionAttributeNames: e.Names(),
		}})
		roles = append(roles, reserveRole{})
	}
	launching := make([]int64, cfg.Shards)
	for _, h := range own {
		launching[h]++
	}
	for _, it := range counterUpdates(cfg, capacity, launching) {
		items, roles = append(items, it), append(roles, reserveRole{counter: capacity})
	}
	if class != nil {
		items, roles = append(items, poolCheck(cfg, pool, class)), append(roles, reserveRole{pool: true})
		for _, it := range counterUpdates(cfg, class, nil) {
			items, roles = append(items, it), append(roles, reserveRole{counter: class})
		}
	}
	return items, roles
}

// counterUpdates are the updates of c's shards that a reservation
// touches: the records each counts, taken from its room on the condition
// that it is stamped for c.max and has that room, and, for a pool's
// counter, launching: the launching tasks whose ids hash to it (nil for a
// class's).
func counterUpdates(cfg Config, c *shardedCount, launching []int64) []types.TransactWriteItem {
	taken := make([]int64, cfg.Shards)
	for _, h := range c.shards {
		taken[h]++
	}
	var out []types.TransactWriteItem
	for i := range cfg.Shards {
		a, l := taken[i], int64(0)
		if launching != nil {
			l = launching[i]
		}
		if a == 0 && l == 0 {
			continue
		}
		e := newExpr()
		var cond *string
		if a > 0 {
			e.Add(attrCapN, avN(a))
			e.Add(attrRoom, avN(-a))
			cond = ptr(e.n(attrCapMax) + " = " + e.v(avN(int64(c.max))) + " AND " + e.n(attrRoom) + " >= " + e.v(avN(a)))
		}
		if l > 0 {
			e.Add(countAttr(string(warmpool.TaskLaunching)), avN(l))
		}
		out = append(out, types.TransactWriteItem{Update: &types.Update{
			TableName: ptr(cfg.TasksTable), Key: key(c.pk(i)), UpdateExpression: e.update(),
			ConditionExpression: cond, ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
		}})
	}
	return out
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

// counterItems reads the items of a sharded counter (strongly
// consistent), by shard; a missing item is nil. pk names shard i's item.
func (s *Store) counterItems(ctx context.Context, pk func(shard int) string) ([]item, error) {
	pks := make([]string, s.cfg.Shards)
	for i := range pks {
		pks[i] = pk(i)
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

// readShards reads every shard of a sharded counter (a pool's capacity,
// a class's total): what it counts, its room and its stamp.
func (s *Store) readShards(ctx context.Context, pk func(shard int) string) ([]counterShard, error) {
	items, err := s.counterItems(ctx, pk)
	if err != nil {
		return nil, err
	}
	out := make([]counterShard, len(items))
	for i, it := range items {
		d := decoder{it: it}
		_, stamped := it[attrCapMax]
		out[i] = counterShard{n: d.n(attrCapN), room: d.n(attrRoom), max: d.n(attrCapMax), stamped: stamped}
		if d.err != nil {
			return nil, fmt.Errorf("counter %s: %w", pk(i), d.err)
		}
	}
	return out, nil
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
	items, err := s.counterItems(ctx, func(i int) string { return capPK(pool, i) })
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
// counters (its pool's and, for a task of a class, its class's). The
// first try expects rec.State (stopping when unset), rec.Class, and the
// shard of its own id as its capacity shard and class shard, where a
// reservation counts a record when that shard has room, so it needs no
// read; when the record differs, the transaction fails with the record as
// stored, and the next try expects exactly that (its version, state,
// class and shards). Deleting an unknown id returns nil.
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
		class   string
		gshard  int64 // -1: no class counts it
		version int64 // 0: any
	}{pool: rec.Pool, state: rec.State, cshard: int64(shardOf(id, s.cfg.Shards)), class: rec.Class, gshard: -1}
	if want.state == "" {
		want.state = warmpool.TaskStopping
	}
	if want.class != "" {
		want.gshard = want.cshard
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
		if want.gshard >= 0 {
			cond += " AND " + e.n(fClass) + " = " + e.v(avS(want.class)) + " AND " + e.n(attrGShard) + " = " + e.v(avN(want.gshard))
		} else {
			cond += " AND attribute_not_exists(" + e.n(attrGShard) + ")"
		}
		items := []types.TransactWriteItem{{Delete: &types.Delete{
			TableName: ptr(s.cfg.TasksTable), Key: key(taskPK(id)), ConditionExpression: &cond,
			ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		}}}
		items = append(items, deleteCounters(s.cfg, want.pool, id, want.state, want.cshard)...)
		if want.gshard >= 0 && int(want.gshard) < s.cfg.Shards {
			items = append(items, classUncount(s.cfg, want.class, int(want.gshard)))
		}
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
			want.cshard, want.class, want.gshard = -1, d.s(fClass), -1
			if _, ok := old[attrCShard]; ok {
				want.cshard = d.n(attrCShard)
			}
			if _, ok := old[attrGShard]; ok {
				want.gshard = d.n(attrGShard)
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
			e.Add(attrRoom, avN(1))
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

// classUncount is the update that takes one task off shard shard of
// class's counter and gives its room back (DeleteTask).
func classUncount(cfg Config, class string, shard int) types.TransactWriteItem {
	e := newExpr()
	e.Add(attrCapN, avN(-1))
	e.Add(attrRoom, avN(1))
	return types.TransactWriteItem{Update: &types.Update{
		TableName: ptr(cfg.TasksTable), Key: key(classCapPK(class, shard)), UpdateExpression: e.update(),
		ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
	}}
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
		got, err := s.batchGet(ctx, s.cfg.TasksTable, ofKind(pks, prefixTask))
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
	recs, next, err := indexRecords(ctx, s, func(shard int) string { return shardKey(pool, shard) }, prefixTask, cursor, limit,
		decodeTask, func(rec warmpool.TaskRecord) bool { return rec.Pool == pool })
	if err != nil {
		return warmpool.TaskPage{}, fmt.Errorf("%s: %w", action, err)
	}
	return warmpool.TaskPage{Tasks: recs, Next: next}, nil
}

// indexRecords is one page of the records that tasks-by-pool lists under
// hashKey (indexPage): those of kind prefix, read with one strongly
// consistent BatchGetItem, in index order, decoded, and kept when keep
// says (the index may lag the record). A record deleted since the index
// listed it is left out.
func indexRecords[R any](ctx context.Context, s *Store, hashKey func(shard int) string, prefix, cursor string, limit int,
	decode func(item) (R, error), keep func(R) bool) ([]R, string, error) {
	pks, next, err := s.indexPage(ctx, hashKey, cursor, limit)
	if err != nil {
		return nil, "", err
	}
	pks = ofKind(pks, prefix)
	got, err := s.batchGet(ctx, s.cfg.TasksTable, pks)
	if err != nil {
		return nil, "", translate("batch get", err)
	}
	var out []R
	for _, pk := range pks {
		it, ok := got[pk]
		if !ok {
			continue
		}
		rec, err := decode(it)
		if err != nil {
			return nil, "", err
		}
		if keep(rec) {
			out = append(out, rec)
		}
	}
	return out, next, nil
}

// indexPage walks the shards of tasks-by-pool whose partition keys hashKey
// names (a pool's tasks, a class's pool records) one after another (keys
// only, Limit per query) and returns at most limit table keys after
// cursor, and the cursor of the next page: the shard and the last key
// read ("<shard>/<pk>"), "" after the last shard. Errors are translated.
func (s *Store) indexPage(ctx context.Context, hashKey func(shard int) string, cursor string, limit int) ([]string, string, error) {
	shard, after := 0, ""
	if cursor != "" {
		i := strings.IndexByte(cursor, '/')
		n, err := strconv.Atoi(cursor[:max(i, 0)])
		if i < 0 || err != nil || n < 0 || n >= s.cfg.Shards {
			return nil, "", fmt.Errorf("bad cursor %q", cursor)
		}
		shard, after = n, cursor[i+1:]
	}
	var pks []string
	next := ""
	for shard < s.cfg.Shards && len(pks) < limit {
		e := newExpr()
		cond := e.n(attrPoolPK) + " = " + e.v(avS(hashKey(shard)))
		in := &dynamodb.QueryInput{TableName: ptr(s.cfg.TasksTable), IndexName: ptr(indexTasksByPool), KeyConditionExpression: &cond,
			ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(), Limit: ref(int32(limit - len(pks)))}
		if after != "" {
			in.ExclusiveStartKey = item{attrPK: avS(after), attrPoolPK: avS(hashKey(shard))}
		}
		out, err := s.db.query(ctx, in)
		if err != nil {
			return nil, "", translate("query "+indexTasksByPool, err)
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
	return pks, next, nil
}

// ofKind returns the keys of pks that start with prefix (an index that
// holds items of two kinds: tasks and pool records).
func ofKind(pks []string, prefix string) []string {
	out := pks[:0:0]
	for _, pk := range pks {
		if strings.HasPrefix(pk, prefix) {
			out = append(out, pk)
		}
	}
	return out
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
