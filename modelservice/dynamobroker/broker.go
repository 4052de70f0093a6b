package dynamobroker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/quarryhq/quarry/internal/clock"
	"github.com/quarryhq/quarry/internal/defaults"
	"github.com/quarryhq/quarry/modelservice"
)

var _ modelservice.Broker = (*Broker)(nil)

// Sizes of bodies: an answer of at most inlineLimit bytes lives in the meta
// item (well under DynamoDB's 400 KB item limit); a larger one, and every
// request body, is split into chunk items of chunkSize bytes.
const (
	inlineLimit = 128 << 10
	chunkSize   = 300 << 10
)

// Defaults of Config's zero fields, and bounds.
const (
	DefaultRetention    = 24 * time.Hour
	DefaultAwaitPoll    = 50 * time.Millisecond
	DefaultClaimPollMin = 25 * time.Millisecond
	DefaultClaimPollMax = 400 * time.Millisecond
	DefaultRecheck      = 2 * time.Second
	DefaultRecheckMax   = 30 * time.Second
	DefaultCallTimeout  = 5 * time.Second
	DefaultQueueShards  = 16
	MaxQueueShards      = 256
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
	// Recheck and RecheckMax bound how often a waiting call reads its own
	// request's state, in case its answer's notice was lost: first when it
	// starts waiting, then after Recheck, doubling up to RecheckMax
	// (defaults 2 s, 30 s), across the relay's successive waits for it.
	Recheck    time.Duration `envconfig:"QUARRY_RELAY_DYNAMODB_RECHECK"`
	RecheckMax time.Duration `envconfig:"QUARRY_RELAY_DYNAMODB_RECHECK_MAX"`
	// CallTimeout bounds each DynamoDB call (default 5 s).
	CallTimeout time.Duration `envconfig:"QUARRY_RELAY_DYNAMODB_CALL_TIMEOUT"`
	// QueueShards is how many partition keys the queue index spreads one
	// owner's requests over (default 16, at most 256): one trainer key
	// sustains about 250 calls/s per shard (docs/ARCHITECTURE.md), and a
	// claim queries every shard. Every replica must use the same value;
	// raising it is safe at any time, lowering it strands the requests
	// queued in the removed shards until their deadline.
	QueueShards int `envconfig:"QUARRY_RELAY_DYNAMODB_QUEUE_SHARDS"`
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
	defaults.Positive(&c.RecheckMax, DefaultRecheckMax)
	defaults.Positive(&c.CallTimeout, DefaultCallTimeout)
	defaults.Positive(&c.QueueShards, DefaultQueueShards)
	c.ClaimPollMax = max(c.ClaimPollMax, c.ClaimPollMin)
	c.RecheckMax = max(c.RecheckMax, c.Recheck)
	if c.Clock == nil {
		c.Clock = clock.System{}
	}
	return c
}

// Validate reports the first invalid field of c, named by its variable:
// durations must not be negative (zero takes the default), QueueShards must
// be at most MaxQueueShards.
func (c Config) Validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"QUARRY_RELAY_RETENTION", c.Retention},
		{"QUARRY_RELAY_DYNAMODB_AWAIT_POLL", c.AwaitPoll},
		{"QUARRY_RELAY_DYNAMODB_CLAIM_POLL_MIN", c.ClaimPollMin},
		{"QUARRY_RELAY_DYNAMODB_CLAIM_POLL_MAX", c.ClaimPollMax},
		{"QUARRY_RELAY_DYNAMODB_RECHECK", c.Recheck},
		{"QUARRY_RELAY_DYNAMODB_RECHECK_MAX", c.RecheckMax},
		{"QUARRY_RELAY_DYNAMODB_CALL_TIMEOUT", c.CallTimeout},
	} {
		if d.v < 0 {
			return fmt.Errorf("%s: %s is negative (0 takes the default)", d.name, d.v)
		}
	}
	if c.QueueShards < 0 || c.QueueShards > MaxQueueShards {
		return fmt.Errorf("QUARRY_RELAY_DYNAMODB_QUEUE_SHARDS: %d; want 1 to %d (0 takes the default, %d)", c.QueueShards, MaxQueueShards, DefaultQueueShards)
	}
	return nil
}

// Broker is the DynamoDB-backed broker: every request is an item in one
// table, so any replica claims, answers and reads any request. Safe for
// concurrent use by many goroutines and replicas.
//
// Each Broker is one replica with its own id. A request records the replica
// that submitted it; an answer given on another replica queues a notice for
// that replica, and a flusher writes the notices queued for one replica as
// one item in its inbox ("N#<replica>"), which that replica reads every
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
	watches   map[string]*watch // request id → this replica's waits for it
	waiting   int               // Await calls waiting now
	polling   bool              // the inbox poller runs
	claimWake chan struct{}     // closed and replaced by a local Submit
	notices   map[string][]string
	queued    int                   // ids in notices
	flushing  bool                  // the notice flusher runs
	lanes     map[string]*claimLane // owner → the turns of its claims
	wg        sync.WaitGroup
}

// New returns a Broker on the table cfg.Table (which CreateTables makes).
// It makes no call; cfg is expected to have passed Validate.
func New(cfg Config, api API, log *slog.Logger) *Broker {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Broker{
		cfg: cfg.WithDefaults(), api: api, log: log, replica: newID(8),
		done: make(chan struct{}), watches: map[string]*watch{}, claimWake: make(chan struct{}),
		notices: map[string][]string{}, lanes: map[string]*claimLane{},
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

// metaItem builds the meta item of ex and its body items: the request body
// always in items of its own (so that the meta item stays small: claims
// rewrite it, waiting calls read it), an answer inline up to inlineLimit.
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
	chunks := setBody(it, ex.ID, requestBody, newID(6), ex.Body, -1, ttl)
	if r := ex.Response; r != nil {
		it[aStatus], it[aCType], it[aAnsAt] = n(int64(r.Status)), s(r.ContentType), ms(r.AnsweredAt)
		chunks = append(chunks, setBody(it, ex.ID, answerBody, newID(6), r.Body, inlineLimit, ttl)...)
	}
	return it, chunks
}

// newID returns n random bytes in hex.
func newID(n int) string {
	id := make([]byte, n)
	_, _ = rand.Read(id)
	return hex.EncodeToString(id)
}

// put writes chunks, then the meta item if its id is new (ErrConflict; the
// chunks, under ids of their own, are then deleted). A failed condition
// may be the SDK's retry of this very write after its first attempt
// succeeded (its answer lost or garbled): when the stored meta item names
// this write's body id, the write is done, and its body stays.
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
		rid := getS(it, aRID)
		cur, gerr := br.getMeta(ctx, rid, requestBody.id, aKeep)
		switch {
		case gerr != nil: // unknown: keep the chunks (they expire by TTL)
			return fmt.Errorf("%s: %w", action, gerr)
		case cur != nil && getS(cur, requestBody.id) == getS(it, requestBody.id):
			return nil
		}
		br.deleteOrphans(ctx, rid, chunks)
		return fmt.Errorf("%s: %w", action, modelservice.ErrConflict)
	}
	return translate(action, err)
}

// deleteOrphans deletes body chunks that no meta item refers to (best
// effort: they expire by TTL anyway).
func (br *Broker) deleteOrphans(ctx context.Context, rid string, chunks []item) {
	if err := br.deleteItems(context.WithoutCancel(ctx), chunks); err != nil {
		br.log.Debug("delete orphan body chunks", "request", rid, "err", err)
	}
}

// Submit queues req: one BatchWriteItem of its body's items (items of 300
// KiB, 25 a call), then one PutItem of its meta item, which enters the
// queue index on shard fnv32a(id) mod QueueShards.
func (br *Broker) Submit(ctx context.Context, req modelservice.Request) error {
	ex := modelservice.Exchange{Request: req, State: modelservice.StatePending}
	ex.Attempt = 0
	it, chunks := br.metaItem(ex)
	it[aQPart], it[aQKey] = s(queuePart(req.Owner, shardOf(req.ID, br.cfg.QueueShards))), s(queueKey(br.now(), req.ID))
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

// getMeta reads the meta item of rid (strongly consistent), only the
// attributes attrs names when it names any; nil when it does not exist or
// its retention has passed. attrs must include aKeep.
func (br *Broker) getMeta(ctx context.Context, rid string, attrs ...string) (item, error) {
	in := &dynamodb.GetItemInput{TableName: aws.String(br.cfg.Table), Key: metaKey(rid), ConsistentRead: aws.Bool(true)}
	if len(attrs) > 0 {
		names := make(map[string]string, len(attrs))
		refs := make([]string, len(attrs))
		for i, a := range attrs {
			refs[i] = "#p" + strconv.Itoa(i)
			names[refs[i]] = a
		}
		in.ProjectionExpression, in.ExpressionAttributeNames = aws.String(strings.Join(refs, ", ")), names
	}
	cctx, cancel := context.WithTimeout(ctx, br.cfg.CallTimeout)
	defer cancel()
	res, err := br.api.GetItem(cctx, in)
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
// the condition fails is the request read, to say why. Then a notice is
// queued for the replica that waits for the answer.
func (br *Broker) Respond(ctx context.Context, id, owner string, resp modelservice.Response) error {
	action := "answer model request " + id
	if br.isClosed() {
		return fmt.Errorf("%s: %w", action, modelservice.ErrClosed)
	}
	now := br.now()
	// The chunks expire with the longest retention a request can have; the
	// meta item keeps its own.
	_, ttl := br.keep(now.Add(maxDeadline))
	upd := item{}
	chunks := setBody(upd, id, answerBody, newID(6), resp.Body, inlineLimit, ttl)
	if err := br.writeChunks(ctx, chunks); err != nil {
		return fmt.Errorf("%s: %w", action, err)
	}
	set := []string{"st = :st", "rs = :rs", "rct = :rct", "rat = :rat", "aid = :aid", "ended = :now", "#as = :as"}
	vals := item{":st": s(string(modelservice.StateAnswered)), ":rs": n(int64(resp.Status)), ":rct": s(resp.ContentType),
		":rat": ms(resp.AnsweredAt), ":aid": upd[aAnsID], ":now": ms(now), ":as": upd[aASize], ":owner": s(owner),
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
		UpdateExpression:          aws.String("SET " + strings.Join(set, ", ") + " " + leaveQueue),
		ExpressionAttributeNames:  map[string]string{"#as": aASize, "#o": aOwner},
		ExpressionAttributeValues: vals,
		ReturnValues:              types.ReturnValueAllOld,
	})
	cancel()
	if isConditionFailed(err) {
		br.deleteOrphans(ctx, id, chunks)
		return br.whyNotAnswerable(ctx, id, owner, action)
	}
	if err != nil {
		return translate(action, err)
	}
	br.notify(getS(res.Attributes, aReplica), id)
	return nil
}

// leaveQueue is the update clause that takes a request out of the queue
// index: its keys, and the first schema's (an item an older gateway wrote).
const leaveQueue = "REMOVE qp, qk, qo"

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

// Cancel ends request id without an answer: one conditional update.
func (br *Broker) Cancel(ctx context.Context, id string, end modelservice.End) (modelservice.Response, error) {
	action := "cancel model request " + id
	cctx, cancel := context.WithTimeout(ctx, br.cfg.CallTimeout)
	_, err := br.api.UpdateItem(cctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(br.cfg.Table), Key: metaKey(id),
		ConditionExpression: aws.String("st IN (:pending, :claimed)"),
		UpdateExpression:    aws.String("SET st = :st, reason = :r, ended = :now " + leaveQueue),
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
	resp, err := br.answerOf(ctx, id, it, action)
	if err != nil {
		return modelservice.Response{}, err
	}
	return resp, fmt.Errorf("%s: %w", action, modelservice.ErrAnswered)
}

// Transcript queries the lease index (eventually consistent: an exchange
// appears there a moment after it is written) and loads the bodies of the
// page with BatchGetItem.
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
	refs := make([]bodyRef, 0, 2*len(metas))
	for _, it := range metas {
		ex := exchangeOf(it)
		refs = append(refs, bodyRef{rid: ex.ID, it: it, a: requestBody})
		if ex.Response != nil {
			refs = append(refs, bodyRef{rid: ex.ID, it: it, a: answerBody})
		}
		out = append(out, ex)
	}
	bodies, err := br.loadBodies(ctx, refs)
	if err != nil {
		return nil, false, err
	}
	for i := range out {
		out[i].Body, bodies = bodies[0], bodies[1:]
		if out[i].Response != nil {
			out[i].Response.Body, bodies = bodies[0], bodies[1:]
		}
	}
	return out, more, nil
}

// Close stops the inbox poller, flushes the queued notices (each write
// bounded by CallTimeout) and makes waiting and later calls return
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
