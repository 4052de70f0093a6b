package dynamobroker

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/modelservice"
)

// fakeAPI is a scriptable API: each method it serves calls its function
// field; the others are nil (a call panics, failing the test).
type fakeAPI struct {
	API
	getItem    func(in *dynamodb.GetItemInput) (*dynamodb.GetItemOutput, error)
	putItem    func(in *dynamodb.PutItemInput) (*dynamodb.PutItemOutput, error)
	updateItem func(in *dynamodb.UpdateItemInput) (*dynamodb.UpdateItemOutput, error)
	query      func(in *dynamodb.QueryInput) (*dynamodb.QueryOutput, error)
	batchWrite func(in *dynamodb.BatchWriteItemInput) (*dynamodb.BatchWriteItemOutput, error)
}

func (f *fakeAPI) BatchWriteItem(_ context.Context, in *dynamodb.BatchWriteItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.BatchWriteItemOutput, error) {
	return f.batchWrite(in)
}

func (f *fakeAPI) GetItem(_ context.Context, in *dynamodb.GetItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	return f.getItem(in)
}

func (f *fakeAPI) PutItem(_ context.Context, in *dynamodb.PutItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	return f.putItem(in)
}

func (f *fakeAPI) UpdateItem(_ context.Context, in *dynamodb.UpdateItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	return f.updateItem(in)
}

func (f *fakeAPI) Query(_ context.Context, in *dynamodb.QueryInput, _ ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	return f.query(in)
}

func emptyQuery(*dynamodb.QueryInput) (*dynamodb.QueryOutput, error) {
	return &dynamodb.QueryOutput{}, nil
}

// pendingMeta is the meta item of a pending request of owner o1.
func pendingMeta(rid string) item {
	now := time.Now()
	it := metaKey(rid)
	it[aRID], it[aOwner], it[aState] = s(rid), s("o1"), s(string(modelservice.StatePending))
	it[aDeadline], it[aKeep] = ms(now.Add(time.Hour)), ms(now.Add(25*time.Hour))
	it[aQBody] = b([]byte(strings.Repeat("x", 5000))) // an old item's inline body
	return it
}

func TestTableDefinition_QueueIsShardedAndProjectsNoBody(t *testing.T) {
	def := TableDefinition("t")
	var queue *types.GlobalSecondaryIndex
	for i, ix := range def.GlobalSecondaryIndexes {
		if aws.ToString(ix.IndexName) == indexQueue {
			queue = &def.GlobalSecondaryIndexes[i]
		}
	}
	require.NotNil(t, queue, "the queue index")
	assert.Equal(t, aQPart, aws.ToString(queue.KeySchema[0].AttributeName), "hashed by owner and shard")
	assert.Equal(t, aQKey, aws.ToString(queue.KeySchema[1].AttributeName))
	require.Equal(t, types.ProjectionTypeInclude, queue.Projection.ProjectionType, "not ALL: the entries must stay small")
	for _, a := range queue.Projection.NonKeyAttributes {
		assert.NotContains(t, []string{aQBody, aABody, aData}, a, "a body attribute in the queue index")
	}
}

func TestShardOf_SpreadsRequestIDsEvenly(t *testing.T) {
	const shards, n = 16, 16000
	counts := make([]int, shards)
	now := time.Now()
	for i := range n {
		counts[shardOf(modelservice.NewRequestID(now.Add(time.Duration(i))), shards)]++
	}
	for i, c := range counts {
		assert.InDelta(t, n/shards, c, n/shards/5, "shard %d", i)
	}
	assert.Equal(t, "o1#3", queuePart("o1", 3))
}

// A waiting call reads only its state, and with backoff kept across the
// relay's steps: 10 steps of 60 ms with Recheck 20 ms, RecheckMax 80 ms
// read at 0, 20, 60, 140, 220, … ms (~9 reads). Waiting as before (the
// whole item at the start of every step, then every Recheck) read ~30
// times.
func TestBroker_Await_ReadsItsStateWithBackoffAcrossSteps(t *testing.T) {
	var (
		mu    sync.Mutex
		reads []*dynamodb.GetItemInput
	)
	api := &fakeAPI{query: emptyQuery, getItem: func(in *dynamodb.GetItemInput) (*dynamodb.GetItemOutput, error) {
		mu.Lock()
		reads = append(reads, in)
		mu.Unlock()
		it := pendingMeta("mrq-1")
		if in.ProjectionExpression != nil { // as DynamoDB: only what is asked
			keepOnly(it, in)
		}
		return &dynamodb.GetItemOutput{Item: it}, nil
	}}
	br := New(Config{Table: "t", Recheck: 20 * time.Millisecond, RecheckMax: 80 * time.Millisecond}, api, nil)
	t.Cleanup(func() { _ = br.Close(context.Background()) })
	for range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond)
		_, err := br.Await(ctx, "mrq-1")
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
	mu.Lock()
	defer mu.Unlock()
	assert.GreaterOrEqual(t, len(reads), 3, "it rechecks")
	assert.LessOrEqual(t, len(reads), 12, "reads of a request that stays pending for 600 ms")
	for _, in := range reads {
		require.NotNil(t, in.ProjectionExpression, "a wait reads a projection, not the whole item")
		assert.True(t, aws.ToBool(in.ConsistentRead))
		projected := projectedNames(in)
		assert.Contains(t, projected, aState)
		assert.NotContains(t, projected, aQBody)
		assert.NotContains(t, projected, aLabels)
	}
}

func projectedNames(in *dynamodb.GetItemInput) []string {
	var out []string
	for _, ref := range strings.Split(aws.ToString(in.ProjectionExpression), ",") {
		out = append(out, in.ExpressionAttributeNames[strings.TrimSpace(ref)])
	}
	return out
}

func keepOnly(it item, in *dynamodb.GetItemInput) {
	keep := map[string]bool{}
	for _, a := range projectedNames(in) {
		keep[a] = true
	}
	for k := range it {
		if !keep[k] {
			delete(it, k)
		}
	}
}

// Answers given while a notice write is under way go out as one item: ten
// answers for another replica make two inbox writes (the first at once,
// the other nine together), where one notice per answer made ten.
func TestBroker_Respond_GroupsNoticesForAReplica(t *testing.T) {
	release := make(chan struct{})
	var (
		mu      sync.Mutex
		notices [][]string
	)
	api := &fakeAPI{
		updateItem: func(in *dynamodb.UpdateItemInput) (*dynamodb.UpdateItemOutput, error) {
			return &dynamodb.UpdateItemOutput{Attributes: item{aReplica: s("other")}}, nil
		},
		putItem: func(in *dynamodb.PutItemInput) (*dynamodb.PutItemOutput, error) {
			mu.Lock()
			first := len(notices) == 0
			notices = append(notices, noticeIDs(in.Item))
			mu.Unlock()
			assert.Equal(t, inboxPK("other"), getS(in.Item, attrPK))
			if first { // bounded, so that a broker that writes notices inline fails instead of hanging
				select {
				case <-release:
				case <-time.After(2 * time.Second):
				}
			}
			return &dynamodb.PutItemOutput{}, nil
		},
	}
	br := New(Config{Table: "t"}, api, nil)
	var want []string
	for i := range 10 {
		rid := fmt.Sprintf("mrq-%02d", i)
		want = append(want, rid)
		require.NoError(t, br.Respond(context.Background(), rid, "o1", modelservice.Response{Status: 200, Body: []byte("{}")}))
		if i == 0 {
			require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(notices) == 1 }, 5*time.Second, time.Millisecond,
				"the first notice is written at once")
		}
	}
	close(release)
	require.NoError(t, br.Close(context.Background()), "Close flushes what is queued")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, notices, 2)
	assert.Equal(t, want[:1], notices[0])
	got := append([]string(nil), notices[1]...)
	sort.Strings(got)
	assert.Equal(t, want[1:], got)
}

// fakeQueue serves the queue index of one owner from sorted lists, a
// page of Limit entries at a time, and counts the pages read.
type fakeQueue struct {
	mu    sync.Mutex
	parts map[string][]item
	pages map[string]int
}

func (q *fakeQueue) query(in *dynamodb.QueryInput) (*dynamodb.QueryOutput, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	part := getS(in.ExpressionAttributeValues, ":p")
	bound := getS(in.ExpressionAttributeValues, ":k")
	q.pages[part]++
	list := q.parts[part]
	i := 0
	if in.ExclusiveStartKey != nil {
		after := getS(in.ExclusiveStartKey, aQKey)
		i = sort.Search(len(list), func(i int) bool { return getS(list[i], aQKey) > after })
	}
	var out dynamodb.QueryOutput
	for ; i < len(list) && getS(list[i], aQKey) <= bound && len(out.Items) < int(aws.ToInt32(in.Limit)); i++ {
		out.Items = append(out.Items, list[i])
	}
	if len(out.Items) == int(aws.ToInt32(in.Limit)) && i < len(list) && getS(list[i], aQKey) <= bound {
		out.LastEvaluatedKey = item{aQKey: out.Items[len(out.Items)-1][aQKey]}
	}
	return &out, nil
}

// The merge yields the entries of all shards in queue-key order, reading
// a shard's next page only when the merge reaches its end, and never one
// beyond the budget.
func TestQueueMerge_OldestFirstAcrossShardsAndPages(t *testing.T) {
	const shards = 4
	br := New(Config{Table: "t", QueueShards: shards}, nil, nil)
	fq := &fakeQueue{parts: map[string][]item{}, pages: map[string]int{}}
	br.api = &fakeAPI{query: fq.query}
	now := time.Now()
	var want []string
	add := func(shard int, at time.Time, rid string) {
		p := queuePart("o1", shard)
		fq.parts[p] = append(fq.parts[p], item{aRID: s(rid), aQKey: s(queueKey(at, rid))})
		want = append(want, queueKey(at, rid))
	}
	// Shard 0 holds the 30 oldest but one (several pages); shard 2 that
	// one, between shard 0's 16th and 17th, so that taking the shards in
	// turn is not the queue's order; the others one each, newer than all
	// of them; and one entry not visible yet.
	for i := range 30 {
		add(0, now.Add(-time.Hour+time.Duration(i)*time.Millisecond), fmt.Sprintf("mrq-a%02d", i))
	}
	add(2, now.Add(-time.Hour+15*time.Millisecond), "mrq-m") // sorts after mrq-a15's key, before mrq-a16's
	for sh := 1; sh < shards; sh++ {
		add(sh, now.Add(-time.Minute+time.Duration(sh)*time.Millisecond), fmt.Sprintf("mrq-b%d", sh))
	}
	sort.Strings(want)
	p3 := queuePart("o1", 3)
	fq.parts[p3] = append(fq.parts[p3], item{aRID: s("mrq-later"), aQKey: s(queueKey(now.Add(time.Minute), "mrq-later"))})

	m := br.newQueueMerge("o1", now, 8) // 8/4+4 = 6 entries a page
	var got []string
	for {
		it, err := m.next(context.Background())
		require.NoError(t, err)
		if it == nil {
			break
		}
		got = append(got, getS(it, aQKey))
	}
	assert.Equal(t, want, got, "one queue's order, the invisible entry left out")
	assert.Equal(t, 5, fq.pages[queuePart("o1", 0)], "30 entries of shard 0 in pages of 6")
	assert.Equal(t, 1, fq.pages[queuePart("o1", 1)])

	// Past the budget of pages a shard's newer entries wait for the next
	// claim.
	for i := 30; i < 40; i++ {
		add(0, now.Add(-time.Hour+time.Duration(i)*time.Millisecond), fmt.Sprintf("mrq-a%02d", i))
	}
	fq.pages = map[string]int{}
	m = br.newQueueMerge("o1", now, 8)
	n := 0
	for {
		it, err := m.next(context.Background())
		require.NoError(t, err)
		if it == nil {
			break
		}
		n++
	}
	assert.Equal(t, maxClaimPages, fq.pages[queuePart("o1", 0)], "the budget")
	assert.Equal(t, maxClaimPages*6+shards, n, "5 pages of shard 0, the entries of the other shards")

	// A claim that stops early reads no more than it needs.
	fq.pages = map[string]int{}
	m = br.newQueueMerge("o1", now, 8)
	for range 3 {
		it, err := m.next(context.Background())
		require.NoError(t, err)
		require.NotNil(t, it)
	}
	assert.Equal(t, 1, fq.pages[queuePart("o1", 0)], "the first page of shard 0 held the 3 oldest")
}

func TestConfig_Validate_NamesTheVariable(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{name: "zero values take the defaults", mutate: func(*Config) {}},
		{name: "negative recheck", mutate: func(c *Config) { c.Recheck = -time.Second }, want: "QUARRY_RELAY_DYNAMODB_RECHECK"},
		{name: "negative recheck max", mutate: func(c *Config) { c.RecheckMax = -time.Second }, want: "QUARRY_RELAY_DYNAMODB_RECHECK_MAX"},
		{name: "negative await poll", mutate: func(c *Config) { c.AwaitPoll = -1 }, want: "QUARRY_RELAY_DYNAMODB_AWAIT_POLL"},
		{name: "negative claim poll", mutate: func(c *Config) { c.ClaimPollMin = -1 }, want: "QUARRY_RELAY_DYNAMODB_CLAIM_POLL_MIN"},
		{name: "negative call timeout", mutate: func(c *Config) { c.CallTimeout = -1 }, want: "QUARRY_RELAY_DYNAMODB_CALL_TIMEOUT"},
		{name: "too many shards", mutate: func(c *Config) { c.QueueShards = MaxQueueShards + 1 }, want: "QUARRY_RELAY_DYNAMODB_QUEUE_SHARDS"},
		{name: "negative shards", mutate: func(c *Config) { c.QueueShards = -1 }, want: "QUARRY_RELAY_DYNAMODB_QUEUE_SHARDS"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var c Config
			tc.mutate(&c)
			err := c.Validate()
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want+":")
		})
	}
	d := Config{Recheck: time.Minute}.WithDefaults()
	assert.Equal(t, DefaultQueueShards, d.QueueShards)
	assert.Equal(t, time.Minute, d.RecheckMax, "RecheckMax is at least Recheck")
}

// The SDK retries a PutItem whose answer it lost or could not read (the
// emulator under load garbles some: "response did not match expected
// checksum"); the retry of a submit that had succeeded fails its
// condition. That submit succeeded: it answers no conflict and keeps its
// body, where it used to delete the body its queued request points to
// (every later claim of the owner then failed reading it).
func TestBroker_Submit_RetriedWriteThatHadSucceededKeepsItsBody(t *testing.T) {
	var (
		mu      sync.Mutex
		stored  item
		deletes int
	)
	api := &fakeAPI{
		batchWrite: func(in *dynamodb.BatchWriteItemInput) (*dynamodb.BatchWriteItemOutput, error) {
			mu.Lock()
			defer mu.Unlock()
			for _, r := range in.RequestItems["t"] {
				if r.DeleteRequest != nil {
					deletes++
				}
			}
			return &dynamodb.BatchWriteItemOutput{}, nil
		},
		putItem: func(in *dynamodb.PutItemInput) (*dynamodb.PutItemOutput, error) {
			mu.Lock()
			defer mu.Unlock()
			if stored == nil { // the first attempt wrote it; its answer was lost
				stored = in.Item
			}
			return nil, &types.ConditionalCheckFailedException{Message: aws.String("The conditional request failed")}
		},
		getItem: func(in *dynamodb.GetItemInput) (*dynamodb.GetItemOutput, error) {
			mu.Lock()
			defer mu.Unlock()
			it := item{}
			for k, v := range stored {
				it[k] = v
			}
			keepOnly(it, in)
			return &dynamodb.GetItemOutput{Item: it}, nil
		},
	}
	br := New(Config{Table: "t"}, api, nil)
	t.Cleanup(func() { _ = br.Close(context.Background()) })
	now := time.Now()
	req := modelservice.Request{ID: modelservice.NewRequestID(now), LeaseID: "sbx-a", Owner: "o1", Pool: "default",
		Route: "chat/completions", Body: []byte(`{"n":1}`), ReceivedAt: now, Deadline: now.Add(time.Minute)}
	require.NoError(t, br.Submit(context.Background(), req))
	mu.Lock()
	assert.Zero(t, deletes, "the body of the stored request is kept")
	mu.Unlock()

	// Another submit of the same id (its own body id) still conflicts, and
	// its body is deleted.
	err := br.Submit(context.Background(), req)
	require.ErrorIs(t, err, modelservice.ErrConflict)
	mu.Lock()
	assert.Equal(t, 1, deletes, "the duplicate's own body is deleted")
	mu.Unlock()
}

// Concurrent claims of one owner on one replica take turns: while one
// claim's shard queries are in flight, the others wait for the lane and
// send nothing. Without the turns, six claims put 6×16 queries in flight at
// once; the emulator, which serves one request at a time, then answered the
// last of them after the 5 s call timeout (a failed run of the conformance
// suite's claim race).
func TestBroker_Claim_ConcurrentClaimsOfAnOwnerTakeTurns(t *testing.T) {
	const claims = 6
	br := New(Config{Table: "t"}, nil, nil)
	var (
		mu              sync.Mutex
		inflight, maxIn int
		release         = make(chan struct{})
	)
	br.api = &fakeAPI{query: func(in *dynamodb.QueryInput) (*dynamodb.QueryOutput, error) {
		mu.Lock()
		inflight++
		maxIn = max(maxIn, inflight)
		mu.Unlock()
		<-release
		mu.Lock()
		inflight--
		mu.Unlock()
		return &dynamodb.QueryOutput{}, nil
	}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make(chan error, claims)
	for range claims {
		go func() {
			_, err := br.Claim(ctx, modelservice.ClaimQuery{Owner: "o1", Max: 4, Visibility: time.Minute})
			errs <- err
		}()
	}
	// Every claim has joined the owner's lane and one claim's queries are
	// all in flight: no other query can start until they are answered.
	// Without the turns, more than one claim's queries are in flight.
	users := func() int {
		br.mu.Lock()
		defer br.mu.Unlock()
		if l := br.lanes["o1"]; l != nil {
			return l.users
		}
		return 0
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return inflight > DefaultQueueShards || inflight == DefaultQueueShards && users() == claims
	}, 30*time.Second, time.Millisecond)
	mu.Lock()
	assert.Equal(t, DefaultQueueShards, inflight, "one claim's queries in flight")
	mu.Unlock()
	close(release)
	for range claims {
		require.NoError(t, <-errs)
	}
	assert.Equal(t, DefaultQueueShards, maxIn, "at most one claim's queries were ever in flight")
	assert.Zero(t, users(), "the lane is gone with its last claim")
}
