package dynamobroker

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"golang.org/x/sync/errgroup"

	"github.com/quarryhq/quarry/modelservice"
)

// shardOf is the queue shard of request rid among shards: uniform, since
// request ids end in random bytes.
func shardOf(rid string, shards int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(rid))
	return int(h.Sum32() % uint32(shards))
}

// queuePart is the queue index's partition key of one shard of owner's
// queue (the shard is the last "#" field, so no two owners share one).
func queuePart(owner string, shard int) string {
	return owner + "#" + strconv.Itoa(shard)
}

// queueKey is the queue index's range key of rid, visible from at.
func queueKey(at time.Time, rid string) string {
	return fmt.Sprintf("%013d#%s", at.UnixMilli(), rid)
}

// Claim reads the visible requests of every shard of the owner's queue,
// oldest first across shards, and claims each with a conditional update
// of its queue key; with none, it waits (local submits wake it; otherwise
// it reads again with backoff). The claims of one owner on this replica
// take turns (see claimLane).
func (br *Broker) Claim(ctx context.Context, q modelservice.ClaimQuery) ([]modelservice.Request, error) {
	q = q.Normalized()
	var timeout <-chan time.Time
	if q.Wait > 0 {
		t := time.NewTimer(q.Wait)
		defer t.Stop()
		timeout = t.C
	}
	lane := br.joinLane(q.Owner)
	defer br.leaveLane(q.Owner, lane)
	pause := br.cfg.ClaimPollMin
	for {
		br.mu.Lock()
		closed, wake := br.closed, br.claimWake
		br.mu.Unlock()
		if closed {
			return nil, fmt.Errorf("claim model requests: %w", modelservice.ErrClosed)
		}
		select {
		case lane.turn <- struct{}{}:
		case <-timeout:
			return nil, nil
		case <-ctx.Done():
			return nil, nil
		case <-br.done:
			return nil, fmt.Errorf("claim model requests: %w", modelservice.ErrClosed)
		}
		out, err := br.claimOnce(ctx, q)
		<-lane.turn
		if err != nil && ctx.Err() != nil {
			return out, nil
		}
		if err != nil || len(out) > 0 || q.Wait <= 0 {
			return out, err
		}
		t := time.NewTimer(pause)
		select {
		case <-wake:
			pause = br.cfg.ClaimPollMin
		case <-t.C:
			pause = min(2*pause, br.cfg.ClaimPollMax)
		case <-timeout:
			t.Stop()
			return nil, nil
		case <-ctx.Done():
			t.Stop()
			return nil, nil
		case <-br.done:
			t.Stop()
			return nil, fmt.Errorf("claim model requests: %w", modelservice.ErrClosed)
		}
		t.Stop()
	}
}

// claimLane makes the claims of one owner on one replica take turns.
// Concurrent claims of one queue read the same oldest entries and race
// for them: all but one conditional update of each fails, and every claim
// has a query per shard in flight. In turns, a replica has at most one
// claim's calls (maxParallel) in flight per owner, and each claim reads
// the queue as the one before left it.
type claimLane struct {
	turn  chan struct{} // holds a token while a claim reads and claims
	users int           // claims waiting for or holding the turn (under br.mu)
}

func (br *Broker) joinLane(owner string) *claimLane {
	br.mu.Lock()
	defer br.mu.Unlock()
	l := br.lanes[owner]
	if l == nil {
		l = &claimLane{turn: make(chan struct{}, 1)}
		br.lanes[owner] = l
	}
	l.users++
	return l
}

func (br *Broker) leaveLane(owner string, l *claimLane) {
	br.mu.Lock()
	defer br.mu.Unlock()
	if l.users--; l.users == 0 {
		delete(br.lanes, owner)
	}
}

// maxClaimPages bounds the index pages one claim reads per shard.
const maxClaimPages = 5

// claimOnce claims up to q.Max visible requests, oldest first, and loads
// their bodies (one BatchGetItem per 100 body items). Requests whose
// bodies cannot be read are not returned (they are offered again after
// their visibility).
func (br *Broker) claimOnce(ctx context.Context, q modelservice.ClaimQuery) ([]modelservice.Request, error) {
	now := br.now()
	m := br.newQueueMerge(q.Owner, now, q.Max)
	var (
		won  []item
		used int64
	)
	for len(won) < q.Max {
		var (
			picked []item
			bytes  = used
		)
		for len(won)+len(picked) < q.Max {
			cand, err := m.next(ctx)
			if err != nil {
				return nil, err
			}
			if cand == nil {
				break
			}
			req := requestOf(cand)
			if !q.Matches(req.Pool, req.Labels) {
				continue
			}
			if !now.Before(req.Deadline) {
				br.expire(ctx, req.ID, getS(cand, aQKey))
				continue
			}
			// What this claim won already counts: only the batch's first
			// request may exceed MaxBytes.
			size := getN(cand, aQSize)
			if !modelservice.WithinBytes(len(won)+len(picked), bytes, size, q.MaxBytes) {
				continue
			}
			picked = append(picked, cand)
			bytes += size
		}
		if len(picked) == 0 {
			break
		}
		got, err := br.claimAll(ctx, picked, q.Visibility, now)
		if err != nil {
			return nil, err
		}
		for _, it := range got {
			used += getN(it, aQSize)
		}
		won = append(won, got...)
	}
	refs := make([]bodyRef, len(won))
	for i, it := range won {
		refs[i] = bodyRef{rid: getS(it, aRID), it: it, a: requestBody}
	}
	bodies, err := br.loadBodies(ctx, refs)
	if err != nil {
		return nil, err
	}
	out := make([]modelservice.Request, len(won))
	for i, it := range won {
		out[i] = requestOf(it)
		out[i].Body = bodies[i]
	}
	return out, nil
}

// queueMerge reads the shards of one owner's queue index and yields their
// visible entries in queue-key order across all shards: the order of one
// queue. A shard's next page is read before the merge chooses whenever
// that shard's buffer is empty and more may follow, so no older entry is
// passed over, within maxClaimPages pages per shard.
type queueMerge struct {
	br     *Broker
	shards []*shardQueue
	limit  int32  // entries per page
	bound  string // queue keys at or below it are visible now
}

// shardQueue is the merge's view of one shard.
type shardQueue struct {
	part  string
	buf   []item
	start item // ExclusiveStartKey of the next page
	more  bool // a next page may follow (within the budget)
	pages int
}

// newQueueMerge prepares the merge of owner's shards for a claim of up to
// max requests at now. Each page holds ⌈max/shards⌉+4 entries (at most
// 100): a uniform queue needs one page per shard.
func (br *Broker) newQueueMerge(owner string, now time.Time, max int) *queueMerge {
	n := br.cfg.QueueShards
	m := &queueMerge{br: br, shards: make([]*shardQueue, n),
		limit: int32(min(100, (max+n-1)/n+4)), bound: fmt.Sprintf("%013d$", now.UnixMilli())}
	for i := range m.shards {
		m.shards[i] = &shardQueue{part: queuePart(owner, i), more: true}
	}
	return m
}

// next returns the oldest visible entry not yet returned, nil when there
// is none (within the budget).
func (m *queueMerge) next(ctx context.Context) (item, error) {
	var empty []*shardQueue
	for _, sq := range m.shards {
		if len(sq.buf) == 0 && sq.more {
			empty = append(empty, sq)
		}
	}
	if len(empty) > 0 {
		if err := m.fill(ctx, empty); err != nil {
			return nil, err
		}
	}
	var best *shardQueue
	for _, sq := range m.shards {
		if len(sq.buf) > 0 && (best == nil || getS(sq.buf[0], aQKey) < getS(best.buf[0], aQKey)) {
			best = sq
		}
	}
	if best == nil {
		return nil, nil
	}
	it := best.buf[0]
	best.buf = best.buf[1:]
	return it, nil
}

// fill reads the next page of each of shards, concurrently.
func (m *queueMerge) fill(ctx context.Context, shards []*shardQueue) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(maxParallel)
	for _, sq := range shards {
		g.Go(func() error {
			cctx, cancel := context.WithTimeout(gctx, m.br.cfg.CallTimeout)
			defer cancel()
			res, err := m.br.api.Query(cctx, &dynamodb.QueryInput{
				TableName: aws.String(m.br.cfg.Table), IndexName: aws.String(indexQueue),
				KeyConditionExpression:    aws.String("qp = :p AND qk <= :k"),
				ExpressionAttributeValues: item{":p": s(sq.part), ":k": s(m.bound)},
				Limit:                     aws.Int32(m.limit), ExclusiveStartKey: sq.start,
			})
			if err != nil {
				return translate("claim model requests", err)
			}
			sq.buf, sq.start = res.Items, res.LastEvaluatedKey
			sq.pages++
			sq.more = len(sq.start) > 0 && sq.pages < maxClaimPages
			return nil
		})
	}
	return g.Wait()
}

// maxParallel bounds the calls one claim runs at once (shard queries,
// conditional updates).
const maxParallel = 16

// claimAll claims the candidates, several at once, and returns the meta
// items (as updated) of those it got, in the candidates' order.
func (br *Broker) claimAll(ctx context.Context, cands []item, visibility time.Duration, now time.Time) ([]item, error) {
	got := make([]item, len(cands))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(maxParallel)
	for i, cand := range cands {
		g.Go(func() error {
			it, err := br.claimOne(gctx, cand, visibility, now)
			got[i] = it
			return err
		})
	}
	err := g.Wait()
	var out []item
	for _, it := range got {
		if it != nil {
			out = append(out, it)
		}
	}
	return out, err
}

// claimOne claims the candidate if its queue key is unchanged and returns
// its meta item as updated (ALL_NEW costs no read capacity); nil when
// another claim got it first.
func (br *Broker) claimOne(ctx context.Context, cand item, visibility time.Duration, now time.Time) (item, error) {
	rid := getS(cand, aRID)
	cctx, cancel := context.WithTimeout(ctx, br.cfg.CallTimeout)
	defer cancel()
	res, err := br.api.UpdateItem(cctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(br.cfg.Table), Key: metaKey(rid),
		ConditionExpression: aws.String("qk = :qk"),
		UpdateExpression:    aws.String("SET st = :st, attempt = attempt + :one, claimed = :now, qk = :next"),
		ExpressionAttributeValues: item{":qk": cand[aQKey], ":st": s(string(modelservice.StateClaimed)), ":one": n(1),
			":now": ms(now), ":next": s(queueKey(now.Add(visibility), rid))},
		ReturnValues: types.ReturnValueAllNew,
	})
	if isConditionFailed(err) {
		return nil, nil
	}
	if err != nil {
		return nil, translate("claim model request "+rid, err)
	}
	return res.Attributes, nil
}

// expire ends a request found past its deadline (best effort: whoever
// changed it first wins).
func (br *Broker) expire(ctx context.Context, rid, qk string) {
	cctx, cancel := context.WithTimeout(ctx, br.cfg.CallTimeout)
	defer cancel()
	_, err := br.api.UpdateItem(cctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(br.cfg.Table), Key: metaKey(rid),
		ConditionExpression: aws.String("qk = :qk"),
		UpdateExpression:    aws.String("SET st = :st, reason = :r, ended = :now " + leaveQueue),
		ExpressionAttributeValues: item{":qk": s(qk), ":st": s(string(modelservice.StateExpired)),
			":r": s("no answer within the request's timeout"), ":now": ms(br.now())},
	})
	if err != nil && !isConditionFailed(err) {
		br.log.Debug("expire model request", "request", rid, "err", err)
	}
}
