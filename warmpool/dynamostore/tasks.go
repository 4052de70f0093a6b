package dynamostore

import (
	"context"
	"fmt"
	"slices"
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

// ReserveTasks implements warmpool.TaskStore: all or none, within
// maxTotal across every replica. The pool's capacity is counted in
// Config.Shards counter items, each allowed its share of maxTotal; one
// transaction creates the records (attribute_not_exists) and increments
// the counters it uses (on the condition that they stay within their
// share). The first try picks one shard at random without reading; when a
// share is full it reads every counter (one BatchGetItem) and spreads the
// records over the shards with room. It returns ErrNoCapacity when the
// shares together have less room than len(recs), ErrConflict when an id
// exists, and an error when len(recs) exceeds MaxReserve(Config.Shards).
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
		var alloc []int64
		if counts == nil {
			alloc = blindAllocation(quota, len(recs), randIntN(s.cfg.Shards))
		}
		if alloc == nil {
			if counts == nil {
				var err error
				if counts, err = s.readCounts(ctx, pool); err != nil {
					return translate(action, err)
				}
			}
			if alloc = allocate(quota, counts, len(recs), randIntN(s.cfg.Shards)); alloc == nil {
				return full(counts)
			}
		}
		items := reserveItems(s.cfg, pool, recs, quota, alloc)
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
			counts = nil // another reservation took the room: read again
			if round > 0 {
				if err := backoff(ctx, round); err != nil {
					return translate(action, err)
				}
			}
			var rerr error
			if counts, rerr = s.readCounts(ctx, pool); rerr != nil {
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

// blindAllocation puts all k reservations in shard start when its quota
// could hold them, without knowing its count; nil otherwise.
func blindAllocation(quota []int64, k, start int) []int64 {
	if quota[start] < int64(k) {
		return nil
	}
	alloc := make([]int64, len(quota))
	alloc[start] = int64(k)
	return alloc
}

// reserveItems builds the transaction of a reservation: one Put per record
// (first, in order, so that reason i names recs[i]) and one conditional
// increment per capacity shard in alloc.
func reserveItems(cfg Config, pool string, recs []warmpool.TaskRecord, quota, alloc []int64) []types.TransactWriteItem {
	items := make([]types.TransactWriteItem, 0, len(recs)+len(alloc))
	var shardOfRec []int // the capacity shard counting recs[i]
	for i, a := range alloc {
		for range a {
			shardOfRec = append(shardOfRec, i)
		}
	}
	for i, r := range recs {
		r.Pool = pool
		r.State = warmpool.TaskLaunching
		r.Version = 1
		e := newExpr()
		cond := "attribute_not_exists(" + e.n(attrPK) + ")"
		items = append(items, types.TransactWriteItem{Put: &types.Put{
			TableName: ptr(cfg.TasksTable), Item: taskItem(r, cfg.Shards, shardOfRec[i]), ConditionExpression: &cond,
			ExpressionAttributeNames: e.Names(),
		}})
	}
	for i, a := range alloc {
		if a == 0 {
			continue
		}
		e := newExpr()
		e.Add(attrCapN, avN(a))
		cond := "attribute_not_exists(" + e.n(attrCapN) + ") OR " + e.n(attrCapN) + " <= " + e.v(avN(quota[i]-a))
		items = append(items, types.TransactWriteItem{Update: &types.Update{
			TableName: ptr(cfg.TasksTable), Key: key(capPK(pool, i)), UpdateExpression: e.update(),
			ConditionExpression: &cond, ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
		}})
	}
	return items
}

// readCounts reads the pool's capacity counters (strongly consistent).
func (s *Store) readCounts(ctx context.Context, pool string) ([]int64, error) {
	pks := make([]string, s.cfg.Shards)
	for i := range pks {
		pks[i] = capPK(pool, i)
	}
	items, err := s.batchGet(ctx, s.cfg.TasksTable, pks)
	if err != nil {
		return nil, err
	}
	counts := make([]int64, s.cfg.Shards)
	for i, pk := range pks {
		if it, ok := items[pk]; ok {
			d := decoder{it: it}
			counts[i] = d.n(attrCapN)
			if d.err != nil {
				return nil, fmt.Errorf("capacity counter %s: %w", pk, d.err)
			}
		}
	}
	return counts, nil
}

// UpdateTask implements warmpool.TaskStore: one UpdateItem conditional on
// the stored version (and pool). It keeps the ready index in step: a task
// entering ready gets a random place in its shard, one leaving it loses it.
func (s *Store) UpdateTask(ctx context.Context, rec warmpool.TaskRecord) (warmpool.TaskRecord, error) {
	const action = "update task"
	if err := warmpool.CheckUpdate(rec); err != nil {
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
	cond := e.n(fVersion) + " = " + e.v(avN(rec.Version)) + " AND " + e.n(fPool) + " = " + e.v(avS(rec.Pool))
	_, err := s.db.updateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: ptr(s.cfg.TasksTable), Key: key(taskPK(rec.ID)), UpdateExpression: e.update(),
		ConditionExpression: &cond, ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if old, ok := isConditionFailed(err); ok {
		if len(old) == 0 {
			return warmpool.TaskRecord{}, fmt.Errorf("update task %s: %w", rec.ID, warmpool.ErrNotFound)
		}
		stored, derr := decodeTask(old)
		switch {
		case derr != nil:
			return warmpool.TaskRecord{}, fmt.Errorf("update task %s: %w", rec.ID, derr)
		case stored.Pool != rec.Pool:
			return warmpool.TaskRecord{}, fmt.Errorf("update task %s: pool cannot change from %q to %q", rec.ID, stored.Pool, rec.Pool)
		}
		return warmpool.TaskRecord{}, fmt.Errorf("update task %s: at version %d, not %d: %w", rec.ID, stored.Version, rec.Version, warmpool.ErrConflict)
	}
	if err != nil {
		return warmpool.TaskRecord{}, translate(action, err)
	}
	return next, nil
}

// DeleteTask implements warmpool.TaskStore: it reads the task, then
// deletes it and decrements its capacity shard in one transaction
// conditional on the version read. Deleting an unknown id returns nil.
func (s *Store) DeleteTask(ctx context.Context, id string) error {
	const action = "delete task"
	if err := s.begin(ctx, action); err != nil {
		return err
	}
	for round := 0; round < maxRounds; round++ {
		it, err := s.getItem(ctx, s.cfg.TasksTable, taskPK(id))
		if err != nil || it == nil {
			return translate(action, err)
		}
		d := decoder{it: it}
		version, pool, cshard := d.n(fVersion), d.s(fPool), d.n(attrCShard)
		if d.err != nil {
			return fmt.Errorf("delete task %s: %w", id, d.err)
		}
		e := newExpr()
		cond := e.n(fVersion) + " = " + e.v(avN(version))
		items := []types.TransactWriteItem{{Delete: &types.Delete{
			TableName: ptr(s.cfg.TasksTable), Key: key(taskPK(id)), ConditionExpression: &cond,
			ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
		}}}
		if cshard >= 0 && int(cshard) < s.cfg.Shards {
			c := newExpr()
			c.Add(attrCapN, avN(-1))
			items = append(items, types.TransactWriteItem{Update: &types.Update{
				TableName: ptr(s.cfg.TasksTable), Key: key(capPK(pool, int(cshard))), UpdateExpression: c.update(),
				ExpressionAttributeNames: c.Names(), ExpressionAttributeValues: c.Values(),
			}})
		}
		_, err = s.db.transact(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items, ClientRequestToken: requestToken()})
		if err == nil {
			return nil
		}
		reasons, ok := cancelReasons(err)
		if !ok {
			return translate(action, err)
		}
		retry, _ := retryableReasons(reasons)
		if reasonCode(reasons, 0) != reasonCondition && !retry {
			return translate(action, err)
		}
		if err := backoff(ctx, round); err != nil { // changed or conflicting: read again
			return translate(action, err)
		}
	}
	return fmt.Errorf("delete task %s: lost %d races in a row: %w", id, maxRounds, warmpool.ErrUnavailable)
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

var _ warmpool.TaskGetter = (*Store)(nil)

// GetTask implements warmpool.TaskGetter: one strongly consistent GetItem.
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
