package dynamobroker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"golang.org/x/sync/errgroup"

	"github.com/quarryhq/quarry/internal/clock"
	"github.com/quarryhq/quarry/internal/defaults"
	"github.com/quarryhq/quarry/modelservice"
)

var _ modelservice.Broker = (*Broker)(nil)

// Sizes of bodies: at most inlineLimit bytes live in the meta item (both
// bodies inline stay well under DynamoDB's 400 KB item limit); larger ones
// are split into chunk items of chunkSize bytes.
const (
	inlineLimit = 128 << 10
	chunkSize   = 300 << 10
)

// Defaults of Config's zero fields.
const (
	DefaultRetention    = 24 * time.Hour
	DefaultAwaitPoll    = 50 * time.Millisecond
	DefaultClaimPollMin = 25 * time.Millisecond
	DefaultClaimPollMax = 400 * time.Millisecond
	DefaultRecheck      = 2 * time.Second
	DefaultCallTimeout  = 5 * time.Second
)

// Config tunes the Broker. cmd/gateway fills it from QUARRY_RELAY_DYNAMODB_*
// variables; zero fields take the defaults.
type Config struct {
	// Table is the relay's table (default "quarry-model-relay"), made by
	// CreateTables.
	Table string `envconfig:"QUARRY_RELAY_DYNAMODB_TABLE"`
	// Retention is how long an exchange stays in its transcript after its
	// request's deadline (default 24 h). Items then expire by DynamoDB's TTL.
	Retention time.Duration `envconfig:"QUARRY_RELAY_RETENTION"`
	// AwaitPoll is how often a replica with calls waiting reads its inbox
	// of answers given on other replicas (default 50 ms): the latency an
	// answer on another replica adds, at one Query per poll per replica.
	AwaitPoll time.Duration `envconfig:"QUARRY_RELAY_DYNAMODB_AWAIT_POLL"`
	// ClaimPollMin and ClaimPollMax bound the backoff of a waiting claim
	// that finds nothing: it queries again after ClaimPollMin, doubling up
	// to ClaimPollMax (defaults 25 ms, 400 ms); a call submitted on the same
	// replica wakes it at once.
	ClaimPollMin time.Duration `envconfig:"QUARRY_RELAY_DYNAMODB_CLAIM_POLL_MIN"`
	ClaimPollMax time.Duration `envconfig:"QUARRY_RELAY_DYNAMODB_CLAIM_POLL_MAX"`
	// Recheck is how often a waiting call reads its own request, in case its
	// answer's notice was lost (default 2 s).
	Recheck time.Duration `envconfig:"QUARRY_RELAY_DYNAMODB_RECHECK"`
	// CallTimeout bounds each DynamoDB call (default 5 s).
	CallTimeout time.Duration `envconfig:"QUARRY_RELAY_DYNAMODB_CALL_TIMEOUT"`
	// Clock tells the time (nil: clock.System).
	Clock clock.Clock `ignored:"true"`
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	defaults.Positive(&c.Retention, DefaultRetention)
	defaults.Positive(&c.AwaitPoll, DefaultAwaitPoll)
	defaults.Positive(&c.ClaimPollMin, DefaultClaimPollMin)
	defaults.Positive(&c.ClaimPollMax, DefaultClaimPollMax)
	defaults.Positive(&c.Recheck, DefaultRecheck)
	defaults.Positive(&c.CallTimeout, DefaultCallTimeout)
	if c.ClaimPollMax < c.ClaimPollMin {
		c.ClaimPollMax = c.ClaimPollMin
	}
	if c.Clock == nil {
		c.Clock = clock.System{}
	}
	return c
}

// Broker is the DynamoDB-backed broker: every request is an item in one
// table, so any replica claims, answers and reads any request. Safe for
// concurrent use by many goroutines and replicas.
//
// Each Broker is one replica with its own id. A request records the replica
// that submitted it; an answer given on another replica leaves a notice in
// that replica's inbox (items "N#<replica>"), which the replica reads every
// AwaitPoll while calls wait: one Query per poll, whatever the number of
// calls in flight.
type Broker struct {
	cfg     Config
	api     API
	log     *slog.Logger
	replica string

	mu        sync.Mutex
	closed    bool
	done      chan struct{}
	waiters   map[string]chan struct{} // request id → closed when its end is noticed
	claimWake chan struct{}            // closed and replaced by a local Submit
	polling   bool
	wg        sync.WaitGroup
}

// New returns a Broker on the table cfg.Table (which CreateTables makes).
// It makes no call.
func New(cfg Config, api API, log *slog.Logger) *Broker {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	return &Broker{
		cfg: cfg.WithDefaults(), api: api, log: log, replica: hex.EncodeToString(id[:]),
		done: make(chan struct{}), waiters: map[string]chan struct{}{}, claimWake: make(chan struct{}),
	}
}

func (br *Broker) now() time.Time { return br.cfg.Clock.Now() }

func (br *Broker) isClosed() bool {
	br.mu.Lock()
	defer br.mu.Unlock()
	return br.closed
}

func (br *Broker) keep(deadline time.Time) (types.AttributeValue, types.AttributeValue) {
	end := deadline.Add(br.cfg.Retention)
	return ms(end), n(end.Unix() + 1)
}

// metaItem builds the meta item of ex and its chunk items.
func (br *Broker) metaItem(ex modelservice.Exchange) (item, []item) {
	keep, ttl := br.keep(ex.Deadline)
	it := metaKey(ex.ID)
	it[aRID], it[aLease], it[aOwner], it[aPool] = s(ex.ID), s(ex.LeaseID), s(ex.Owner), s(ex.Pool)
	it[aLabels], it[aRoute], it[aStream] = labelsAttr(ex.Labels), s(ex.Route), bl(ex.Stream)
	it[aRecv], it[aDeadline], it[aKeep], it[attrTTL] = ms(ex.ReceivedAt), ms(ex.Deadline), keep, ttl
	it[aState], it[aAttempt], it[aReplica] = s(string(ex.State)), n(int64(ex.Attempt)), s(br.replica)
	if ex.Reason != "" {
		it[aReason] = s(ex.Reason)
	}
	if ex.Upstream != "" {
		it[aUpstream] = s(ex.Upstream)
	}
	if ex.Truncated {
		it[aTrunc] = bl(true)
	}
	if !ex.EndedAt.IsZero() {
		it[aEnded] = ms(ex.EndedAt)
	}
	chunks := setBody(it, ex.ID, "Q#", aQBody, aQChunks, aQSize, ex.Body, ttl)
	if r := ex.Response; r != nil {
		aid := newAnswerID()
		it[aStatus], it[aCType], it[aAnsAt], it[aAnsID] = n(int64(r.Status)), s(r.ContentType), ms(r.AnsweredAt), s(aid)
		chunks = append(chunks, setBody(it, ex.ID, "A#"+aid+"#", aABody, aAChunks, aASize, r.Body, ttl)...)
	}
	return it, chunks
}

func newAnswerID() string {
	var id [6]byte
	_, _ = rand.Read(id[:])
	return hex.EncodeToString(id[:])
}

// put writes chunks, then the meta item if its id is new (ErrConflict).
func (br *Broker) put(ctx context.Context, action string, it item, chunks []item) error {
	if br.isClosed() {
		return fmt.Errorf("%s: %w", action, modelservice.ErrClosed)
	}
	if err := br.writeChunks(ctx, chunks); err != nil {
		return fmt.Errorf("%s: %w", action, err)
	}
	cctx, cancel := context.WithTimeout(ctx, br.cfg.CallTimeout)
	defer cancel()
	_, err := br.api.PutItem(cctx, &dynamodb.PutItemInput{
		TableName: aws.String(br.cfg.Table), Item: it, ConditionExpression: aws.String("attribute_not_exists(pk)"),
	})
	if isConditionFailed(err) {
		return fmt.Errorf("%s: %w", action, modelservice.ErrConflict)
	}
	return translate(action, err)
}

// Submit queues req: one PutItem (plus chunk writes for a body over 128
// KiB).
func (br *Broker) Submit(ctx context.Context, req modelservice.Request) error {
	ex := modelservice.Exchange{Request: req, State: modelservice.StatePending}
	ex.Attempt = 0
	it, chunks := br.metaItem(ex)
	it[aQOwner], it[aQKey] = s(req.Owner), s(queueKey(br.now(), req.ID))
	if err := br.put(ctx, "submit model request "+req.ID, it, chunks); err != nil {
		return err
	}
	br.mu.Lock()
	close(br.claimWake)
	br.claimWake = make(chan struct{})
	br.mu.Unlock()
	return nil
}

// Record stores a finished exchange.
func (br *Broker) Record(ctx context.Context, ex modelservice.Exchange) error {
	it, chunks := br.metaItem(ex)
	return br.put(ctx, "record model exchange "+ex.ID, it, chunks)
}

// Claim queries the owner's queue index for visible requests and claims
// each with a conditional update on its queue key; with none, it waits
// (local submits wake it; otherwise it queries again with backoff).
func (br *Broker) Claim(ctx context.Context, q modelservice.ClaimQuery) ([]modelservice.Request, error) {
	q = q.Normalized()
	var timeout <-chan time.Time
	if q.Wait > 0 {
		t := time.NewTimer(q.Wait)
		defer t.Stop()
		timeout = t.C
	}
	pause := br.cfg.ClaimPollMin
	for {
		br.mu.Lock()
		closed, wake := br.closed, br.claimWake
		br.mu.Unlock()
		if closed {
			return nil, fmt.Errorf("claim model requests: %w", modelservice.ErrClosed)
		}
		out, err := br.claimOnce(ctx, q)
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

// maxClaimPages bounds the index pages one claim reads.
const maxClaimPages = 5

func (br *Broker) claimOnce(ctx context.Context, q modelservice.ClaimQuery) ([]modelservice.Request, error) {
	now := br.now()
	var (
		out    []modelservice.Request
		picked []item
		bytes  int64
		start  item
	)
	for page := 0; page < maxClaimPages && len(out) < q.Max; page++ {
		cctx, cancel := context.WithTimeout(ctx, br.cfg.CallTimeout)
		res, err := br.api.Query(cctx, &dynamodb.QueryInput{
			TableName: aws.String(br.cfg.Table), IndexName: aws.String(indexQueue),
			KeyConditionExpression:    aws.String("qo = :o AND qk <= :k"),
			ExpressionAttributeValues: item{":o": s(q.Owner), ":k": s(fmt.Sprintf("%013d$", now.UnixMilli()))},
			Limit:                     aws.Int32(int32(min(100, 2*q.Max+8))), ExclusiveStartKey: start,
		})
		cancel()
		if err != nil {
			return out, translate("claim model requests", err)
		}
		for _, cand := range res.Items {
			if len(out) >= q.Max {
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
			size := getN(cand, aQSize)
			// Earlier pages' claims count: only the batch's first request
			// may exceed MaxBytes.
			if !modelservice.WithinBytes(len(out)+len(picked), bytes, size, q.MaxBytes) {
				continue
			}
			if len(out)+len(picked) >= q.Max {
				break
			}
			picked = append(picked, cand)
			bytes += size
		}
		got, err := br.claimAll(ctx, picked, q.Visibility, now)
		out = append(out, got...)
		if err != nil {
			return out, err
		}
		picked = picked[:0]
		if len(res.LastEvaluatedKey) == 0 {
			break
		}
		start = res.LastEvaluatedKey
	}
	return out, nil
}

// claimParallel bounds the conditional updates one claim runs at once.
const claimParallel = 8

// claimAll claims the candidates, several at once, and returns those it
// got, in the candidates' order.
func (br *Broker) claimAll(ctx context.Context, cands []item, visibility time.Duration, now time.Time) ([]modelservice.Request, error) {
	got := make([]*modelservice.Request, len(cands))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(claimParallel)
	for i, cand := range cands {
		g.Go(func() error {
			r, ok, err := br.claimOne(gctx, cand, visibility, now)
			if ok {
				got[i] = &r
			}
			return err
		})
	}
	err := g.Wait()
	var out []modelservice.Request
	for _, r := range got {
		if r != nil {
			out = append(out, *r)
		}
	}
	return out, err
}

// claimOne claims the candidate if its queue key is unchanged; ok is false
// when another claim got it first.
func (br *Broker) claimOne(ctx context.Context, cand item, visibility time.Duration, now time.Time) (modelservice.Request, bool, error) {
	rid := getS(cand, aRID)
	cctx, cancel := context.WithTimeout(ctx, br.cfg.CallTimeout)
	res, err := br.api.UpdateItem(cctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(br.cfg.Table), Key: metaKey(rid),
		ConditionExpression: aws.String("qk = :qk"),
		UpdateExpression:    aws.String("SET st = :st, attempt = attempt + :one, claimed = :now, qk = :next"),
		ExpressionAttributeValues: item{":qk": cand[aQKey], ":st": s(string(modelservice.StateClaimed)), ":one": n(1),
			":now": ms(now), ":next": s(queueKey(now.Add(visibility), rid))},
		ReturnValues: types.ReturnValueAllNew,
	})
	cancel()
	if isConditionFailed(err) {
		return modelservice.Request{}, false, nil
	}
	if err != nil {
		return modelservice.Request{}, false, translate("claim model request "+rid, err)
	}
	req := requestOf(res.Attributes)
	if req.Body, err = br.loadBody(ctx, res.Attributes, rid, "Q#", aQBody, aQChunks); err != nil {
		return modelservice.Request{}, false, err
	}
	return req, true, nil
}

// expire ends a request found past its deadline (best effort: whoever
// changed it first wins).
func (br *Broker) expire(ctx context.Context, rid, qk string) {
	cctx, cancel := context.WithTimeout(ctx, br.cfg.CallTimeout)
	defer cancel()
	_, err := br.api.UpdateItem(cctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(br.cfg.Table), Key: metaKey(rid),
		ConditionExpression: aws.String("qk = :qk"),
		UpdateExpression:    aws.String("SET st = :st, reason = :r, ended = :now REMOVE qo, qk"),
		ExpressionAttributeValues: item{":qk": s(qk), ":st": s(string(modelservice.StateExpired)),
			":r": s("no answer within the request's timeout"), ":now": ms(br.now())},
	})
	if err != nil && !isConditionFailed(err) {
		br.log.Debug("expire model request", "request", rid, "err", err)
	}
}

// getMeta reads the meta item of rid (strongly consistent); nil when it
// does not exist or its retention has passed.
func (br *Broker) getMeta(ctx context.Context, rid string) (item, error) {
	cctx, cancel := context.WithTimeout(ctx, br.cfg.CallTimeout)
	defer cancel()
	res, err := br.api.GetItem(cctx, &dynamodb.GetItemInput{TableName: aws.String(br.cfg.Table), Key: metaKey(rid), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, translate("read model request "+rid, err)
	}
	if len(res.Item) == 0 || !br.now().Before(getTime(res.Item, aKeep)) {
		return nil, nil
	}
	return res.Item, nil
}

// openState classifies a request that cannot be answered (nil while it
// can).
func openState(it item, now time.Time) error {
	st := modelservice.State(getS(it, aState))
	switch {
	case st == modelservice.StateAnswered:
		return modelservice.ErrAnswered
	case st.Ended():
		return fmt.Errorf("%w (%s: %s)", modelservice.ErrGone, st, getS(it, aReason))
	case !now.Before(getTime(it, aDeadline)):
		return fmt.Errorf("%w (expired)", modelservice.ErrGone)
	}
	return nil
}

// Respond answers request id of owner: chunk writes for an answer over 128
// KiB and one conditional update (owner, open state, deadline); only when
// the condition fails is the request read, to say why. Then a notice goes
// to the replica that waits for the answer.
func (br *Broker) Respond(ctx context.Context, id, owner string, resp modelservice.Response) error {
	action := "answer model request " + id
	if br.isClosed() {
		return fmt.Errorf("%s: %w", action, modelservice.ErrClosed)
	}
	now := br.now()
	aid := newAnswerID()
	// The chunks expire with the longest retention a request can have; the
	// meta item keeps its own.
	_, ttl := br.keep(now.Add(maxDeadline))
	upd := item{}
	chunks := setBody(upd, id, "A#"+aid+"#", aABody, aAChunks, aASize, resp.Body, ttl)
	if err := br.writeChunks(ctx, chunks); err != nil {
		return fmt.Errorf("%s: %w", action, err)
	}
	set := []string{"st = :st", "rs = :rs", "rct = :rct", "rat = :rat", "aid = :aid", "ended = :now", "#as = :as"}
	vals := item{":st": s(string(modelservice.StateAnswered)), ":rs": n(int64(resp.Status)), ":rct": s(resp.ContentType),
		":rat": ms(resp.AnsweredAt), ":aid": s(aid), ":now": ms(now), ":as": upd[aASize], ":owner": s(owner),
		":pending": s(string(modelservice.StatePending)), ":claimed": s(string(modelservice.StateClaimed))}
	if v, ok := upd[aABody]; ok {
		set, vals[":ab"] = append(set, "ab = :ab"), v
	} else {
		set, vals[":an"] = append(set, "an = :an"), upd[aAChunks]
	}
	cctx, cancel := context.WithTimeout(ctx, br.cfg.CallTimeout)
	res, err := br.api.UpdateItem(cctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(br.cfg.Table), Key: metaKey(id),
		ConditionExpression:       aws.String("#o = :owner AND st IN (:pending, :claimed) AND deadline > :now"),
		UpdateExpression:          aws.String("SET " + strings.Join(set, ", ") + " REMOVE qo, qk"),
		ExpressionAttributeNames:  map[string]string{"#as": aASize, "#o": aOwner},
		ExpressionAttributeValues: vals,
		ReturnValues:              types.ReturnValueAllOld,
	})
	cancel()
	if isConditionFailed(err) {
		if derr := br.deleteItems(context.WithoutCancel(ctx), chunks); derr != nil {
			br.log.Debug("delete orphan answer chunks", "request", id, "err", derr)
		}
		return br.whyNotAnswerable(ctx, id, owner, action)
	}
	if err != nil {
		return translate(action, err)
	}
	br.notify(ctx, getS(res.Attributes, aReplica), id)
	return nil
}

// maxDeadline bounds how far ahead a request's deadline may be (the
// relay's longest timeout).
const maxDeadline = 24 * time.Hour

// whyNotAnswerable reads request id after a failed answer and says why it
// failed: unknown or another owner's (ErrNotFound), answered (ErrAnswered),
// ended or past its deadline (ErrGone; an open one past its deadline is
// ended as expired).
func (br *Broker) whyNotAnswerable(ctx context.Context, id, owner, action string) error {
	it, err := br.getMeta(ctx, id)
	switch {
	case err != nil:
		return err
	case it == nil || getS(it, aOwner) != owner:
		return fmt.Errorf("%s: %w", action, modelservice.ErrNotFound)
	}
	if st := modelservice.State(getS(it, aState)); !st.Ended() && !br.now().Before(getTime(it, aDeadline)) {
		if qk := getS(it, aQKey); qk != "" {
			br.expire(ctx, id, qk)
		}
	}
	if oerr := openState(it, br.now()); oerr != nil {
		return fmt.Errorf("%s: %w", action, oerr)
	}
	return fmt.Errorf("%s: %w", action, modelservice.ErrAnswered)
}

// notify tells the replica that submitted rid that it ended: directly when
// that is this replica, otherwise through its inbox (best effort: the
// waiter also rechecks every Config.Recheck).
func (br *Broker) notify(ctx context.Context, replica, rid string) {
	if replica == br.replica {
		br.wake(rid)
		return
	}
	_, ttl := br.keep(br.now())
	it := inboxKey(replica, rid)
	it[attrTTL] = ttl
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), br.cfg.CallTimeout)
	defer cancel()
	if _, err := br.api.PutItem(cctx, &dynamodb.PutItemInput{TableName: aws.String(br.cfg.Table), Item: it}); err != nil {
		br.log.Warn("notify the waiting replica", "request", rid, "replica", replica, "err", err)
	}
}

// wake wakes the local waiters of rid.
func (br *Broker) wake(rid string) {
	br.mu.Lock()
	defer br.mu.Unlock()
	if ch, ok := br.waiters[rid]; ok {
		close(ch)
		delete(br.waiters, rid)
	}
}

// waitFor returns the channel closed when rid's end is noticed, and starts
// the inbox poller if it is not running.
func (br *Broker) waitFor(rid string) (<-chan struct{}, error) {
	br.mu.Lock()
	defer br.mu.Unlock()
	if br.closed {
		return nil, modelservice.ErrClosed
	}
	ch, ok := br.waiters[rid]
	if !ok {
		ch = make(chan struct{})
		br.waiters[rid] = ch
	}
	if !br.polling {
		br.polling = true
		br.wg.Add(1)
		go br.pollInbox()
	}
	return ch, nil
}

// pollInbox reads this replica's inbox every AwaitPoll while calls wait,
// wakes their waiters and deletes the notices. It stops when no call waits
// or the broker closes.
func (br *Broker) pollInbox() {
	defer br.wg.Done()
	t := time.NewTicker(br.cfg.AwaitPoll)
	defer t.Stop()
	for {
		select {
		case <-br.done:
			return
		case <-t.C:
		}
		br.mu.Lock()
		if len(br.waiters) == 0 {
			br.polling = false
			br.mu.Unlock()
			return
		}
		br.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), br.cfg.CallTimeout)
		res, err := br.api.Query(ctx, &dynamodb.QueryInput{
			TableName: aws.String(br.cfg.Table), KeyConditionExpression: aws.String("pk = :pk"),
			ExpressionAttributeValues: item{":pk": s("N#" + br.replica)}, ConsistentRead: aws.Bool(true), Limit: aws.Int32(1000),
		})
		if err != nil {
			cancel()
			br.log.Warn("read the model relay inbox", "err", err)
			continue
		}
		for _, it := range res.Items {
			br.wake(getS(it, attrSK))
		}
		if err := br.deleteItems(ctx, res.Items); err != nil {
			br.log.Debug("delete inbox notices", "err", err)
		}
		cancel()
	}
}

// Await waits until request id ends: it reads the request, then waits for
// a notice (local, or from the inbox poller), rechecking every
// Config.Recheck.
func (br *Broker) Await(ctx context.Context, id string) (modelservice.Response, error) {
	action := "await model request " + id
	for {
		ch, err := br.waitFor(id)
		if err != nil {
			return modelservice.Response{}, fmt.Errorf("%s: %w", action, err)
		}
		it, err := br.getMeta(ctx, id)
		if err != nil {
			if ctx.Err() != nil {
				return modelservice.Response{}, ctx.Err()
			}
			return modelservice.Response{}, err
		}
		if it == nil {
			br.forget(id, ch)
			return modelservice.Response{}, fmt.Errorf("%s: %w", action, modelservice.ErrNotFound)
		}
		if st := modelservice.State(getS(it, aState)); st.Ended() {
			br.forget(id, ch)
			return br.answerOf(ctx, it, action)
		}
		t := time.NewTimer(br.cfg.Recheck)
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			br.forget(id, ch)
			return modelservice.Response{}, ctx.Err()
		case <-br.done:
			t.Stop()
			return modelservice.Response{}, fmt.Errorf("%s: %w", action, modelservice.ErrClosed)
		}
		t.Stop()
	}
}

// forget drops the waiter of rid if it is still ch.
func (br *Broker) forget(rid string, ch <-chan struct{}) {
	br.mu.Lock()
	defer br.mu.Unlock()
	if cur, ok := br.waiters[rid]; ok && (<-chan struct{})(cur) == ch {
		delete(br.waiters, rid)
	}
}

// answerOf returns the answer of an ended request, or ErrGone.
func (br *Broker) answerOf(ctx context.Context, it item, action string) (modelservice.Response, error) {
	st := modelservice.State(getS(it, aState))
	if st != modelservice.StateAnswered {
		return modelservice.Response{}, fmt.Errorf("%s: %w (%s: %s)", action, modelservice.ErrGone, st, getS(it, aReason))
	}
	rid := getS(it, aRID)
	body, err := br.loadBody(ctx, it, rid, "A#"+getS(it, aAnsID)+"#", aABody, aAChunks)
	if err != nil {
		return modelservice.Response{}, err
	}
	return modelservice.Response{Status: int(getN(it, aStatus)), ContentType: getS(it, aCType), Body: body, AnsweredAt: getTime(it, aAnsAt)}, nil
}

// Cancel ends request id without an answer: one conditional update.
func (br *Broker) Cancel(ctx context.Context, id string, end modelservice.End) (modelservice.Response, error) {
	action := "cancel model request " + id
	cctx, cancel := context.WithTimeout(ctx, br.cfg.CallTimeout)
	_, err := br.api.UpdateItem(cctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(br.cfg.Table), Key: metaKey(id),
		ConditionExpression: aws.String("st IN (:pending, :claimed)"),
		UpdateExpression:    aws.String("SET st = :st, reason = :r, ended = :now REMOVE qo, qk"),
		ExpressionAttributeValues: item{":pending": s(string(modelservice.StatePending)), ":claimed": s(string(modelservice.StateClaimed)),
			":st": s(string(end.State)), ":r": s(end.Reason), ":now": ms(br.now())},
	})
	cancel()
	if err == nil {
		br.wake(id)
		return modelservice.Response{}, nil
	}
	if !isConditionFailed(err) {
		return modelservice.Response{}, translate(action, err)
	}
	it, err := br.getMeta(ctx, id)
	switch {
	case err != nil:
		return modelservice.Response{}, err
	case it == nil:
		return modelservice.Response{}, fmt.Errorf("%s: %w", action, modelservice.ErrNotFound)
	case getS(it, aState) != string(modelservice.StateAnswered):
		return modelservice.Response{}, nil
	}
	resp, err := br.answerOf(ctx, it, action)
	if err != nil {
		return modelservice.Response{}, err
	}
	return resp, fmt.Errorf("%s: %w", action, modelservice.ErrAnswered)
}

// Transcript queries the lease index (eventually consistent: an exchange
// appears there a moment after it is written) and loads the bodies of the
// page.
func (br *Broker) Transcript(ctx context.Context, q modelservice.TranscriptQuery) ([]modelservice.Exchange, bool, error) {
	q = q.Normalized()
	if br.isClosed() {
		return nil, false, fmt.Errorf("read transcript: %w", modelservice.ErrClosed)
	}
	now := br.now()
	var (
		metas []item
		bytes int64
		start item
		more  bool
	)
	after := q.After
	if after == "" {
		after = " " // below every id
	}
collect:
	for {
		cctx, cancel := context.WithTimeout(ctx, br.cfg.CallTimeout)
		res, err := br.api.Query(cctx, &dynamodb.QueryInput{
			TableName: aws.String(br.cfg.Table), IndexName: aws.String(indexLease),
			KeyConditionExpression:    aws.String("#l = :l AND #r > :a"),
			ExpressionAttributeNames:  map[string]string{"#l": aLease, "#r": aRID},
			ExpressionAttributeValues: item{":l": s(q.LeaseID), ":a": s(after)},
			Limit:                     aws.Int32(int32(min(q.Limit+1, 1000))), ExclusiveStartKey: start,
		})
		cancel()
		if err != nil {
			return nil, false, translate("read transcript of "+q.LeaseID, err)
		}
		for _, it := range res.Items {
			if (q.Owner != "" && getS(it, aOwner) != q.Owner) || !now.Before(getTime(it, aKeep)) {
				continue
			}
			size := getN(it, aQSize) + getN(it, aASize)
			if len(metas) >= q.Limit || !modelservice.WithinBytes(len(metas), bytes, size, q.MaxBytes) {
				more = true
				break collect
			}
			bytes += size
			metas = append(metas, it)
		}
		if len(res.LastEvaluatedKey) == 0 {
			break
		}
		start = res.LastEvaluatedKey
	}
	out := make([]modelservice.Exchange, 0, len(metas))
	for _, it := range metas {
		ex := exchangeOf(it)
		var err error
		if ex.Body, err = br.loadBody(ctx, it, ex.ID, "Q#", aQBody, aQChunks); err != nil {
			return nil, false, err
		}
		if ex.Response != nil {
			if ex.Response.Body, err = br.loadBody(ctx, it, ex.ID, "A#"+getS(it, aAnsID)+"#", aABody, aAChunks); err != nil {
				return nil, false, err
			}
		}
		out = append(out, ex)
	}
	return out, more, nil
}

// Close stops the inbox poller and makes waiting and later calls return
// ErrClosed. It does not touch the table. Idempotent.
func (br *Broker) Close(ctx context.Context) error {
	br.mu.Lock()
	if !br.closed {
		br.closed = true
		close(br.done)
	}
	br.mu.Unlock()
	done := make(chan struct{})
	go func() {
		br.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close model relay broker: %w", ctx.Err())
	}
}
