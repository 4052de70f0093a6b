package dynamostore

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"golang.org/x/sync/errgroup"

	"github.com/quarryhq/quarry/warmpool"
)

// Items of a claim's transaction, by index.
const (
	claimTask = iota
	claimLease
	claimIdem
)

// claimOutcome is what one claim transaction came to.
type claimOutcome int

const (
	claimed      claimOutcome = iota
	taskTaken                 // the task changed or is contended: try another
	keyTaken                  // the idempotency key names a lease already: replay it
	leaseExists               // the lease id exists: ErrConflict
	claimRetried              // a conflicting transaction or throttling: try again
)

// Claim implements warmpool.LeaseStore. A claim of any ready task picks a
// random shard of the pool's ready index, queries a few candidates from a
// random place in it (ClaimCandidates; a second query wraps to the shard's
// start when nothing follows that place) and claims one with a transaction
// of up to three items: the task (its version and state must still match;
// it leaves the ready index), the new lease (its id must be new) and the
// owner's idempotency key (it must be free). Candidates that someone else
// took are skipped. An empty shard sends the claim to a sweep of every
// shard (see sweep); ErrNoCapacity when all are empty. The happy path is
// two calls (one Query, one TransactWriteItems), three with the wrap. A claim by TaskID reads that task instead of
// querying. When the key is taken, the lease it names is returned with
// Replayed set and nothing is claimed (Task is then left zero).
func (s *Store) Claim(ctx context.Context, req warmpool.ClaimRequest) (warmpool.ClaimResult, error) {
	const action = "claim"
	if err := warmpool.CheckClaim(req); err != nil {
		return warmpool.ClaimResult{}, err
	}
	if err := s.begin(ctx, action); err != nil {
		return warmpool.ClaimResult{}, err
	}
	c := &claim{s: s, req: req}
	var res warmpool.ClaimResult
	var err error
	if req.TaskID != "" {
		res, err = c.byID(ctx)
	} else {
		res, err = c.anyReady(ctx)
	}
	if err != nil {
		return warmpool.ClaimResult{Stale: c.stale}, translate(action, err)
	}
	res.Stale = c.stale
	return res, nil
}

// claim is one Claim call in progress.
type claim struct {
	s   *Store
	req warmpool.ClaimRequest
	// staleKey is the lease id a stale idempotency item names (its lease
	// was purged): the claim may overwrite it.
	staleKey string
	// replay is the lease to return when the key was taken.
	replay warmpool.Lease
	// stale are the ready tasks of another spec than req.Spec that the
	// claim moved to stopping (at most warmpool.StaleScan).
	stale []warmpool.TaskRecord
}

// byID claims req.TaskID, which must be ready or launching.
func (c *claim) byID(ctx context.Context) (warmpool.ClaimResult, error) {
	for round := 0; round < maxRounds; round++ {
		it, err := c.s.getItem(ctx, c.s.cfg.TasksTable, taskPK(c.req.TaskID))
		if err != nil {
			return warmpool.ClaimResult{}, err
		}
		if it == nil {
			return warmpool.ClaimResult{}, fmt.Errorf("task %s in pool %q: %w", c.req.TaskID, c.req.Pool, warmpool.ErrNotFound)
		}
		task, err := decodeTask(it)
		switch {
		case err != nil:
			return warmpool.ClaimResult{}, err
		case task.Pool != c.req.Pool:
			return warmpool.ClaimResult{}, fmt.Errorf("task %s in pool %q: %w", c.req.TaskID, c.req.Pool, warmpool.ErrNotFound)
		case task.State != warmpool.TaskReady && task.State != warmpool.TaskLaunching:
			return warmpool.ClaimResult{}, fmt.Errorf("task %s is %s, not ready or launching: %w", task.ID, task.State, warmpool.ErrConflict)
		case c.req.Spec != "" && task.Spec != c.req.Spec:
			return warmpool.ClaimResult{}, fmt.Errorf("task %s was launched for another configuration of pool %q: %w", task.ID, c.req.Pool, warmpool.ErrConflict)
		}
		res, outcome, err := c.try(ctx, task)
		if done, res, err := c.settle(ctx, res, outcome, err); done {
			return res, err
		}
		if err := backoff(ctx, round); err != nil {
			return warmpool.ClaimResult{}, err
		}
	}
	return warmpool.ClaimResult{}, fmt.Errorf("task %s: lost %d races in a row: %w", c.req.TaskID, maxRounds, warmpool.ErrUnavailable)
}

// anyReady claims one ready task of the pool: candidates from a random
// place in a random shard (wrapping to its start), or, when that shard is
// empty, from a sweep of every shard.
func (c *claim) anyReady(ctx context.Context) (warmpool.ClaimResult, error) {
	for round := 0; round < maxRounds; round++ {
		var cands []warmpool.TaskRecord
		var err error
		if !c.s.sweepFirst(c.req.Pool) {
			shard, from := randIntN(c.s.cfg.Shards), randSortKey()
			cands, err = c.s.readyCandidates(ctx, c.req.Pool, shard, &from)
			if err == nil && len(cands) == 0 { // nothing after the random place: wrap to the start
				cands, err = c.s.readyCandidates(ctx, c.req.Pool, shard, nil)
			}
			if err != nil {
				return warmpool.ClaimResult{}, err
			}
		}
		if len(cands) == 0 { // this shard is empty, or a sweep is due: look at every shard
			if cands, err = c.s.sweep(ctx, c.req.Pool); err != nil {
				return warmpool.ClaimResult{}, err
			}
			if len(cands) == 0 {
				return c.noneReady(ctx)
			}
		}
		tried, retired := false, len(c.stale)
		for _, i := range randPerm(len(cands)) {
			if c.req.Spec != "" && cands[i].Spec != c.req.Spec {
				c.retireStale(ctx, cands[i])
				continue
			}
			tried = true
			res, outcome, err := c.try(ctx, cands[i])
			if done, res, err := c.settle(ctx, res, outcome, err); done {
				return res, err
			}
		}
		switch {
		case !tried && len(c.stale) >= warmpool.StaleScan:
			return c.noneReady(ctx) // the stale ones are reported; the caller comes back
		case !tried && len(c.stale) > retired:
			continue // only stale tasks, now stopping: the next query sees past them
		}
		if err := backoff(ctx, round); err != nil { // every candidate was taken
			return warmpool.ClaimResult{}, err
		}
	}
	return warmpool.ClaimResult{}, fmt.Errorf("pool %q: lost %d races in a row: %w", c.req.Pool, maxRounds, warmpool.ErrUnavailable)
}

// sweep returns up to ClaimCandidates ready tasks from the start of every
// shard of the pool's ready index (queried concurrently); none means the
// pool has no ready task. Concurrent claims of one pool on this Store share
// one sweep, and a claim that starts while one is under way, or soon after
// one found the pool empty, goes to it without a query of its own (the
// claims of an exhausted pool would otherwise cost two queries each, plus
// Shards per sweep). So a claim may see the pool as of a sweep that began
// a few milliseconds before it, within the index's own propagation delay,
// and notices a cancelled ctx when the sweep ends (each query is bounded
// by the call timeout). The result is shared: callers must not modify it.
func (s *Store) sweep(ctx context.Context, pool string) ([]warmpool.TaskRecord, error) {
	v, err, _ := s.sweeps.Do(pool, func() (any, error) {
		s.sweepMu.Lock()
		s.sweeping[pool]++
		s.sweepMu.Unlock()
		defer func() {
			s.sweepMu.Lock()
			if s.sweeping[pool]--; s.sweeping[pool] == 0 {
				delete(s.sweeping, pool)
			}
			s.sweepMu.Unlock()
		}()
		// Runs on the first caller's goroutine, detached from its ctx (the
		// others wait for it too); every query is bounded by the call
		// timeout.
		sctx := context.WithoutCancel(ctx)
		per := make([][]warmpool.TaskRecord, s.cfg.Shards)
		g, gctx := errgroup.WithContext(sctx)
		g.SetLimit(fanOut)
		for i := range s.cfg.Shards {
			g.Go(func() error {
				cands, err := s.readyCandidates(gctx, pool, i, nil)
				per[i] = cands
				return err
			})
		}
		if err := g.Wait(); err != nil {
			return nil, err
		}
		var all []warmpool.TaskRecord
		for _, p := range per {
			all = append(all, p...)
		}
		s.sweepMu.Lock()
		if len(all) == 0 {
			s.emptyAt[pool] = time.Now()
		} else {
			delete(s.emptyAt, pool)
		}
		s.sweepMu.Unlock()
		return all, nil
	})
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return v.([]warmpool.TaskRecord), nil
}

// sweepFirst reports whether a claim of pool should go straight to a
// sweep: one is under way, or the last one (less than emptyHint ago)
// found the pool empty. The answer still comes from a sweep begun after
// (or at most one sweep before) the claim: only the way to it changes.
func (s *Store) sweepFirst(pool string) bool {
	s.sweepMu.Lock()
	defer s.sweepMu.Unlock()
	at, empty := s.emptyAt[pool]
	return s.sweeping[pool] > 0 || empty && time.Since(at) < emptyHint
}

// readyCandidates returns up to ClaimCandidates ready tasks of one shard of
// the pool's ready index: from *from on, or from its start.
func (s *Store) readyCandidates(ctx context.Context, pool string, shard int, from *int64) ([]warmpool.TaskRecord, error) {
	e := newExpr()
	cond := e.n(attrReadyPK) + " = " + e.v(avS(shardKey(pool, shard)))
	if from != nil {
		cond += " AND " + e.n(attrReadySK) + " >= " + e.v(avN(*from))
	}
	out, err := s.db.query(ctx, &dynamodb.QueryInput{
		TableName: ptr(s.cfg.TasksTable), IndexName: ptr(indexReady), KeyConditionExpression: &cond,
		ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values(),
		Limit: ref(int32(s.cfg.ClaimCandidates)),
	})
	if err != nil {
		return nil, err
	}
	tasks := make([]warmpool.TaskRecord, 0, len(out.Items))
	for _, it := range out.Items {
		t, err := decodeTask(it)
		if err != nil {
			return nil, err
		}
		if t.State == warmpool.TaskReady && t.Pool == pool {
			tasks = append(tasks, t)
		}
	}
	return tasks, nil
}

// retireStale moves a ready task of another spec than the claim's to
// stopping (one conditional write; a task that changed meanwhile is left
// to whoever changed it) and notes it, at most warmpool.StaleScan per
// claim: past that, the claim passes over stale tasks without a write.
func (c *claim) retireStale(ctx context.Context, task warmpool.TaskRecord) {
	if len(c.stale) >= warmpool.StaleScan {
		return
	}
	next := task
	next.State, next.Reason, next.UpdatedAt = warmpool.TaskStopping, warmpool.ReasonStaleSpec, c.req.Now
	if out, err := c.s.UpdateTask(ctx, next, warmpool.TaskReady); err == nil {
		c.stale = append(c.stale, out)
	}
}

// noneReady ends a claim that found no ready task: ErrNoCapacity, unless
// the owner's idempotency key names a lease already (then that lease is
// replayed, as the contract asks, without a launch for nothing).
func (c *claim) noneReady(ctx context.Context) (warmpool.ClaimResult, error) {
	if c.req.Lease.IdempotencyKey != "" {
		it, err := c.s.getItem(ctx, c.s.cfg.LeasesTable, idemPK(c.req.Lease.Owner, c.req.Lease.IdempotencyKey))
		if err != nil {
			return warmpool.ClaimResult{}, err
		}
		if it != nil && !ttlPassed(it, c.req.Now) {
			if l, ok, err := c.s.liveLease(ctx, (&decoder{it: it}).s(fLeaseID)); err != nil {
				return warmpool.ClaimResult{}, err
			} else if ok {
				return warmpool.ClaimResult{Lease: l, Replayed: true}, nil
			}
		}
	}
	return warmpool.ClaimResult{}, fmt.Errorf("pool %q has no ready task: %w", c.req.Pool, warmpool.ErrNoCapacity)
}

// settle turns one transaction's outcome into the claim's answer: done is
// false when the claim should go on with another candidate or round.
func (c *claim) settle(ctx context.Context, res warmpool.ClaimResult, outcome claimOutcome, err error) (bool, warmpool.ClaimResult, error) {
	switch {
	case err != nil:
		return true, warmpool.ClaimResult{}, err
	case outcome == claimed:
		return true, res, nil
	case outcome == leaseExists:
		return true, warmpool.ClaimResult{}, fmt.Errorf("lease %s exists already: %w", c.req.Lease.ID, warmpool.ErrConflict)
	case outcome == keyTaken:
		return true, warmpool.ClaimResult{Lease: c.replay, Replayed: true}, nil
	}
	if err := ctx.Err(); err != nil {
		return true, warmpool.ClaimResult{}, err
	}
	return false, warmpool.ClaimResult{}, nil
}

// try claims task (as read, at its version) in one transaction.
func (c *claim) try(ctx context.Context, task warmpool.TaskRecord) (warmpool.ClaimResult, claimOutcome, error) {
	cfg := c.s.cfg
	l, next := warmpool.ClaimedLease(c.req, task)

	te := newExpr()
	te.Set(fState, avS(string(next.State)))
	te.Set(fLeaseID, avS(next.LeaseID))
	te.Set(fGeneration, avN(next.Generation))
	te.Set(fVersion, avN(next.Version))
	te.Set(fUpdatedAt, avTime(next.UpdatedAt))
	te.Remove(fReason, attrReadyPK, attrReadySK)
	tcond := te.n(fVersion) + " = " + te.v(avN(task.Version)) + " AND " + te.n(fState) + " = " + te.v(avS(string(task.State)))
	le := newExpr()
	lcond := "attribute_not_exists(" + le.n(attrPK) + ")"
	items := []types.TransactWriteItem{
		{Update: &types.Update{TableName: ptr(cfg.TasksTable), Key: key(taskPK(task.ID)), UpdateExpression: te.update(),
			ConditionExpression: &tcond, ExpressionAttributeNames: te.Names(), ExpressionAttributeValues: te.Values()}},
		{Put: &types.Put{TableName: ptr(cfg.LeasesTable), Item: leaseItem(l, cfg.Shards, cfg.EndedTTL, false),
			ConditionExpression: &lcond, ExpressionAttributeNames: le.Names()}},
	}
	if k := l.IdempotencyKey; k != "" {
		ie := newExpr()
		icond := "attribute_not_exists(" + ie.n(attrPK) + ") OR " + ie.n(attrTTL) + " <= " + ie.v(avN(c.req.Now.Unix()))
		if c.staleKey != "" {
			icond += " OR " + ie.n(fLeaseID) + " = " + ie.v(avS(c.staleKey))
		}
		items = append(items, types.TransactWriteItem{Put: &types.Put{
			TableName: ptr(cfg.LeasesTable), Item: idemItem(l), ConditionExpression: &icond,
			ExpressionAttributeNames: ie.Names(), ExpressionAttributeValues: ie.Values(),
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		}})
	}
	if env := envItem(l); env != nil { // after the conditional items: reasons index them
		items = append(items, types.TransactWriteItem{Put: &types.Put{TableName: ptr(cfg.LeasesTable), Item: env}})
	}
	items = append(items, *countUpdate(cfg, c.req.Pool, task.ID, task.State, warmpool.TaskLeased))
	_, err := c.s.db.transact(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items, ClientRequestToken: requestToken()})
	if err == nil {
		return warmpool.ClaimResult{Lease: l, Task: next}, claimed, nil
	}
	reasons, ok := cancelReasons(err)
	if !ok {
		return warmpool.ClaimResult{}, 0, err
	}
	switch {
	case reasonCode(reasons, claimLease) == reasonCondition:
		return warmpool.ClaimResult{}, leaseExists, nil
	case reasonCode(reasons, claimIdem) == reasonCondition:
		return c.keyTaken(ctx, reasons[claimIdem].Item)
	case reasonCode(reasons, claimTask) == reasonCondition:
		return warmpool.ClaimResult{}, taskTaken, nil
	}
	retry, throttled := retryableReasons(reasons)
	switch {
	case !retry:
		return warmpool.ClaimResult{}, 0, err
	case throttled:
		return warmpool.ClaimResult{}, 0, fmt.Errorf("claim task %s: %w: %w", task.ID, warmpool.ErrUnavailable, err)
	case reasonCode(reasons, claimTask) == reasonConflict:
		return warmpool.ClaimResult{}, taskTaken, nil // another claim is on it: likely taken
	}
	return warmpool.ClaimResult{}, claimRetried, nil
}

// keyTaken handles a claim whose idempotency key names a lease already
// (old is the key's item): that lease is replayed; if it is gone (purged,
// or past its TTL), the key is stale and the next try may overwrite it.
func (c *claim) keyTaken(ctx context.Context, old item) (warmpool.ClaimResult, claimOutcome, error) {
	var leaseID string
	if len(old) == 0 { // an emulator without ReturnValuesOnConditionCheckFailure: read it
		it, err := c.s.getItem(ctx, c.s.cfg.LeasesTable, idemPK(c.req.Lease.Owner, c.req.Lease.IdempotencyKey))
		if err != nil {
			return warmpool.ClaimResult{}, 0, err
		}
		old = it
	}
	if old != nil {
		leaseID = (&decoder{it: old}).s(fLeaseID)
	}
	l, ok, err := c.s.liveLease(ctx, leaseID)
	if err != nil {
		return warmpool.ClaimResult{}, 0, err
	}
	if !ok {
		c.staleKey = leaseID
		return warmpool.ClaimResult{}, claimRetried, nil
	}
	c.replay = l
	return warmpool.ClaimResult{}, keyTaken, nil
}

// idemItem is the idempotency key item of l: it names l's lease.
func idemItem(l warmpool.Lease) item {
	return item{attrPK: avS(idemPK(l.Owner, l.IdempotencyKey)), fLeaseID: avS(l.ID), fOwner: avS(l.Owner)}
}
