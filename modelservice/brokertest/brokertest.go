package brokertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/modelservice"
)

// Options tunes the suite. Zero fields take the defaults noted on each.
type Options struct {
	// NewReplica opens another handle onto the same data as b (a second
	// replica's broker), closed by the test's cleanup. Nil means the
	// replica tests use b itself (a broker that cannot be shared).
	NewReplica func(t *testing.T, b modelservice.Broker) modelservice.Broker
	// RaceRequests is how many requests the claim race queues (60);
	// RaceClaimers how many goroutines claim them at once (6).
	RaceRequests int
	RaceClaimers int
	// LargeBody is the size of the bodies of the large-body test (1 MiB:
	// over DynamoDB's 400 KB item limit).
	LargeBody int
}

func (o Options) withDefaults() Options {
	if o.RaceRequests <= 0 {
		o.RaceRequests = 60
	}
	if o.RaceClaimers <= 0 {
		o.RaceClaimers = 6
	}
	if o.LargeBody <= 0 {
		o.LargeBody = 1 << 20
	}
	return o
}

// waitLong bounds every wait of the suite: generous, because CI machines
// are small and busy; a passing test never waits this long.
const waitLong = 30 * time.Second

// Run runs the conformance suite. newBroker returns a new, empty broker for
// one subtest and registers its own cleanup (which must tolerate a broker
// the suite has closed).
func Run(t *testing.T, newBroker func(t *testing.T) modelservice.Broker, opts Options) {
	opts = opts.withDefaults()
	tests := []struct {
		name string
		fn   func(t *testing.T, b modelservice.Broker, o Options)
	}{
		{"Submit_ClaimReturnsItOnceByteForByte", testSubmitClaim},
		{"Submit_DuplicateIDConflicts", testSubmitDuplicate},
		{"Claim_OnlyTheOwnersRequests", testClaimOwner},
		{"Claim_FiltersByPoolAndLabels", testClaimFilters},
		{"Claim_MaxOldestFirst", testClaimMax},
		{"Claim_MaxBelowOneClaimsOne", testClaimMaxBelowOne},
		{"Claim_OldestFirstAcrossManyRequests", testClaimOldestFirstMany},
		{"Claim_MaxBytesBoundsTheBatch", testClaimMaxBytes},
		{"Claim_MaxBytesBoundsTheBatchAcrossPages", testClaimMaxBytesPages},
		{"Claim_WaitsForASubmit", testClaimWaits},
		{"Claim_WaitEndsEmpty", testClaimWaitEnds},
		{"Claim_UnansweredIsOfferedAgainAfterVisibility", testClaimVisibility},
		{"Claim_SkipsRequestsPastTheirDeadline", testClaimDeadline},
		{"Respond_DeliversToAwait", testRespondAwait},
		{"Respond_TwiceIsAnswered", testRespondTwice},
		{"Respond_AfterCancelIsGone", testRespondAfterCancel},
		{"Respond_UnknownOrOtherOwnerNotFound", testRespondNotFound},
		{"Respond_ConcurrentAnswersOneWins", testRespondRace},
		{"Cancel_AfterAnswerReturnsTheAnswer", testCancelAfterAnswer},
		{"Cancel_IsIdempotent", testCancelIdempotent},
		{"Await_CancelledIsGone", testAwaitCancelled},
		{"Await_ReturnsWhenCtxEnds", testAwaitCtx},
		{"Await_InStepsGetsAnAnswerGivenBetweenThem", testAwaitSteps},
		{"Transcript_PagesOldestFirst", testTranscript},
		{"Transcript_LimitBelowOneReturnsOne", testTranscriptLimitBelowOne},
		{"Transcript_OwnerSeesOnlyItsOwn", testTranscriptOwner},
		{"Record_AppearsInTranscript", testRecord},
		{"LargeBodies_RoundTripByteForByte", testLargeBodies},
		{"Replicas_SubmitOnOneAnswerOnAnother", testReplicas},
		{"Race_EveryRequestClaimedOnce", testClaimRace},
		{"Close_WakesWaiters", testClose},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, newBroker(t), opts)
		})
	}
}

// seq makes request ids unique and increasing within the test binary.
var seq atomic.Int64

// newRequest returns a request of owner on lease with a JSON body, a
// deadline well ahead and a unique, increasing id.
func newRequest(owner, lease string) modelservice.Request {
	now := time.Now()
	seq.Add(1)
	return modelservice.Request{
		ID:      modelservice.NewRequestID(now.Add(time.Duration(seq.Load()))),
		LeaseID: lease, Owner: owner, Pool: "default", Labels: map[string]string{"run": "r1"},
		Route: "chat/completions", Stream: false,
		Body:       []byte(fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hi %d"}]}`, seq.Load())),
		ReceivedAt: now.UTC().Truncate(time.Millisecond), Deadline: now.Add(10 * time.Minute).UTC().Truncate(time.Millisecond),
	}
}

func claimQuery(owner string) modelservice.ClaimQuery {
	return modelservice.ClaimQuery{Owner: owner, Max: 100, Visibility: time.Minute}
}

func answer(body string) modelservice.Response {
	return modelservice.Response{Status: 200, ContentType: "application/json", Body: []byte(body), AnsweredAt: time.Now().UTC().Truncate(time.Millisecond)}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitLong)
	t.Cleanup(cancel)
	return ctx
}

func ids(rs []modelservice.Request) []string {
	out := make([]string, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return out
}

// awaitResult is what an Await returned.
type awaitResult struct {
	resp modelservice.Response
	err  error
}

// awaitAsync runs Await in the background (bounded by waitLong).
func awaitAsync(ctx context.Context, b modelservice.Broker, id string) <-chan awaitResult {
	done := make(chan awaitResult, 1)
	go func() {
		actx, cancel := context.WithTimeout(ctx, waitLong)
		defer cancel()
		r, err := b.Await(actx, id)
		done <- awaitResult{r, err}
	}()
	return done
}

func testSubmitClaim(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	req := newRequest("o1", "sbx-a")
	req.Stream = true
	req.Body = []byte("{\"a\": \"\\u00e9 \xff binary\",\n  \"stream\": true}")
	require.NoError(t, b.Submit(ctx, req))

	got, err := b.Claim(ctx, claimQuery("o1"))
	require.NoError(t, err)
	require.Len(t, got, 1)
	c := got[0]
	assert.Equal(t, req.ID, c.ID)
	assert.Equal(t, req.LeaseID, c.LeaseID)
	assert.Equal(t, req.Pool, c.Pool)
	assert.Equal(t, req.Labels, c.Labels)
	assert.Equal(t, req.Route, c.Route)
	assert.True(t, c.Stream)
	assert.Equal(t, req.Body, c.Body, "the body reaches the trainer byte for byte")
	assert.True(t, req.ReceivedAt.Equal(c.ReceivedAt))
	assert.True(t, req.Deadline.Equal(c.Deadline))
	assert.Equal(t, 1, c.Attempt)

	again, err := b.Claim(ctx, claimQuery("o1"))
	require.NoError(t, err)
	assert.Empty(t, again, "a claimed request is hidden until its visibility ends")
}

func testSubmitDuplicate(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	req := newRequest("o1", "sbx-a")
	require.NoError(t, b.Submit(ctx, req))
	assert.ErrorIs(t, b.Submit(ctx, req), modelservice.ErrConflict)
}

func testClaimOwner(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	require.NoError(t, b.Submit(ctx, newRequest("o1", "sbx-a")))
	got, err := b.Claim(ctx, claimQuery("o2"))
	require.NoError(t, err)
	assert.Empty(t, got, "another owner sees nothing")
	got, err = b.Claim(ctx, claimQuery("o1"))
	require.NoError(t, err)
	assert.Len(t, got, 1)
}

func testClaimFilters(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	a := newRequest("o1", "sbx-a")
	a.Pool, a.Labels = "p1", map[string]string{"run": "r1", "split": "train"}
	bb := newRequest("o1", "sbx-b")
	bb.Pool, bb.Labels = "p2", map[string]string{"run": "r1"}
	c := newRequest("o1", "sbx-c")
	c.Pool, c.Labels = "p1", map[string]string{"run": "r2"}
	for _, r := range []modelservice.Request{a, bb, c} {
		require.NoError(t, b.Submit(ctx, r))
	}
	tests := []struct {
		name   string
		pool   string
		labels map[string]string
		want   []string
	}{
		{name: "pool", pool: "p2", want: []string{bb.ID}},
		{name: "labels", labels: map[string]string{"run": "r1", "split": "train"}, want: []string{a.ID}},
		{name: "pool and label", pool: "p1", labels: map[string]string{"run": "r2"}, want: []string{c.ID}},
		{name: "no match", pool: "p3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q := claimQuery("o1")
			q.Pool, q.Labels = tc.pool, tc.labels
			got, err := b.Claim(ctx, q)
			require.NoError(t, err)
			assert.Equal(t, tc.want, nilIfEmpty(ids(got)))
		})
	}
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

// submitEach submits n requests of owner o1, one per lease sbx-<i>, and
// returns their ids, oldest first.
func submitEach(t *testing.T, b modelservice.Broker, n int) []string {
	t.Helper()
	ctx := ctxT(t)
	var out []string
	for i := 0; i < n; i++ {
		r := newRequest("o1", fmt.Sprintf("sbx-%d", i))
		require.NoError(t, b.Submit(ctx, r))
		out = append(out, r.ID)
	}
	return out
}

func testClaimMax(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	want := submitEach(t, b, 5)
	q := claimQuery("o1")
	q.Max = 3
	got, err := b.Claim(ctx, q)
	require.NoError(t, err)
	assert.Equal(t, want[:3], ids(got), "oldest first, at most Max")
	got, err = b.Claim(ctx, q)
	require.NoError(t, err)
	assert.Equal(t, want[3:], ids(got))
}

// testClaimMaxBelowOne checks ClaimQuery.Normalized: a Max below 1 claims
// one request, the oldest.
func testClaimMaxBelowOne(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	want := submitEach(t, b, 3)
	for i, max := range []int{0, -1} {
		q := claimQuery("o1")
		q.Max = max
		got, err := b.Claim(ctx, q)
		require.NoError(t, err)
		assert.Equal(t, want[i:i+1], ids(got), "Max %d claims the oldest one", max)
	}
}

// testClaimOldestFirstMany queues more requests than one claim takes, so
// that a broker that spreads its queue (over partitions, shards) must
// merge them: every batch is the oldest of what is left, in order.
func testClaimOldestFirstMany(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	want := submitEach(t, b, 40)
	q := claimQuery("o1")
	q.Max = 7
	var got []string
	for batch := 0; len(got) < len(want); batch++ {
		require.Less(t, batch, 10, "claims stopped returning requests: got %d of %d", len(got), len(want))
		rs, err := b.Claim(ctx, q)
		require.NoError(t, err)
		require.NotEmpty(t, rs)
		require.LessOrEqual(t, len(rs), q.Max)
		end := min(len(got)+q.Max, len(want))
		assert.Equal(t, want[len(got):end], ids(rs), "batch %d: the oldest requests left, oldest first", batch)
		got = append(got, ids(rs)...)
	}
	rs, err := b.Claim(ctx, q)
	require.NoError(t, err)
	assert.Empty(t, rs)
}

func testClaimMaxBytes(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	var want []string
	for i := 0; i < 3; i++ {
		r := newRequest("o1", "sbx-a")
		r.Body = bytes.Repeat([]byte("x"), 1000)
		require.NoError(t, b.Submit(ctx, r))
		want = append(want, r.ID)
	}
	q := claimQuery("o1")
	q.MaxBytes = 500
	got, err := b.Claim(ctx, q)
	require.NoError(t, err)
	assert.Equal(t, want[:1], ids(got), "the first request comes whatever its size")
	q.MaxBytes = 2500
	got, err = b.Claim(ctx, q)
	require.NoError(t, err)
	assert.Equal(t, want[1:], ids(got))
}

// testClaimMaxBytesPages puts many requests of another pool between two
// large ones, so that a broker that reads its queue in pages meets the
// second on a later page: MaxBytes still counts the first.
func testClaimMaxBytesPages(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	big := func() string {
		r := newRequest("o1", "sbx-a")
		r.Body = bytes.Repeat([]byte("x"), 1000)
		require.NoError(t, b.Submit(ctx, r))
		return r.ID
	}
	first := big()
	for i := 0; i < 40; i++ {
		r := newRequest("o1", "sbx-b")
		r.Pool = "other"
		require.NoError(t, b.Submit(ctx, r))
	}
	second := big()
	q := claimQuery("o1")
	q.Pool, q.Max, q.MaxBytes = "default", 5, 1500
	got, err := b.Claim(ctx, q)
	require.NoError(t, err)
	assert.Equal(t, []string{first}, ids(got), "the second large request would pass MaxBytes")
	got, err = b.Claim(ctx, q)
	require.NoError(t, err)
	assert.Equal(t, []string{second}, ids(got))
}

func testClaimWaits(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	req := newRequest("o1", "sbx-a")
	type result struct {
		got []modelservice.Request
		err error
	}
	done := make(chan result, 1)
	go func() {
		q := claimQuery("o1")
		q.Wait = waitLong
		got, err := b.Claim(ctx, q)
		done <- result{got, err}
	}()
	require.NoError(t, b.Submit(ctx, req))
	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, []string{req.ID}, ids(r.got))
}

func testClaimWaitEnds(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	q := claimQuery("o1")
	q.Wait = 50 * time.Millisecond
	got, err := b.Claim(ctx, q)
	require.NoError(t, err)
	assert.Empty(t, got)

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	q.Wait = waitLong
	got, err = b.Claim(cctx, q)
	require.NoError(t, err, "an ended ctx ends the wait without an error")
	assert.Empty(t, got)
}

func testClaimVisibility(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	req := newRequest("o1", "sbx-a")
	require.NoError(t, b.Submit(ctx, req))
	q := claimQuery("o1")
	q.Visibility = 200 * time.Millisecond
	got, err := b.Claim(ctx, q)
	require.NoError(t, err)
	require.Len(t, got, 1)

	q.Wait = waitLong
	got, err = b.Claim(ctx, q)
	require.NoError(t, err)
	require.Len(t, got, 1, "offered again once the visibility timeout passed")
	assert.Equal(t, req.ID, got[0].ID)
	assert.Equal(t, 2, got[0].Attempt)
	require.NoError(t, b.Respond(ctx, req.ID, "o1", answer(`{"ok":1}`)), "the second claimer answers")
}

func testClaimDeadline(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	req := newRequest("o1", "sbx-a")
	req.Deadline = time.Now().Add(-time.Second)
	require.NoError(t, b.Submit(ctx, req))
	got, err := b.Claim(ctx, claimQuery("o1"))
	require.NoError(t, err)
	assert.Empty(t, got)
	assert.ErrorIs(t, b.Respond(ctx, req.ID, "o1", answer(`{}`)), modelservice.ErrGone)
}

func testRespondAwait(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	req := newRequest("o1", "sbx-a")
	require.NoError(t, b.Submit(ctx, req))
	done := awaitAsync(ctx, b, req.ID)
	want := modelservice.Response{Status: 429, ContentType: "application/json", Body: []byte("{\"error\":\n{\"message\":\"slow down \xfe\"}}"),
		AnsweredAt: time.Now().UTC().Truncate(time.Millisecond)}
	require.NoError(t, b.Respond(ctx, req.ID, "o1", want))
	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, want.Status, r.resp.Status)
	assert.Equal(t, want.ContentType, r.resp.ContentType)
	assert.Equal(t, want.Body, r.resp.Body)
	assert.True(t, want.AnsweredAt.Equal(r.resp.AnsweredAt))

	// Await after the answer returns it at once.
	r2, err := b.Await(ctx, req.ID)
	require.NoError(t, err)
	assert.Equal(t, want.Body, r2.Body)
}

func testRespondTwice(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	req := newRequest("o1", "sbx-a")
	require.NoError(t, b.Submit(ctx, req))
	require.NoError(t, b.Respond(ctx, req.ID, "o1", answer(`{"n":1}`)))
	assert.ErrorIs(t, b.Respond(ctx, req.ID, "o1", answer(`{"n":2}`)), modelservice.ErrAnswered)
	r, err := b.Await(ctx, req.ID)
	require.NoError(t, err)
	assert.Equal(t, `{"n":1}`, string(r.Body), "the first answer stands")
}

func testRespondAfterCancel(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	tests := []struct {
		name  string
		state modelservice.State
	}{
		{"cancelled", modelservice.StateCancelled},
		{"expired", modelservice.StateExpired},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := newRequest("o1", "sbx-a")
			require.NoError(t, b.Submit(ctx, req))
			_, err := b.Cancel(ctx, req.ID, modelservice.End{State: tc.state, Reason: "the agent went away"})
			require.NoError(t, err)
			assert.ErrorIs(t, b.Respond(ctx, req.ID, "o1", answer(`{}`)), modelservice.ErrGone)
			got, err := b.Claim(ctx, claimQuery("o1"))
			require.NoError(t, err)
			assert.Empty(t, got, "an ended request is not offered")
		})
	}
}

func testRespondNotFound(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	req := newRequest("o1", "sbx-a")
	require.NoError(t, b.Submit(ctx, req))
	assert.ErrorIs(t, b.Respond(ctx, req.ID, "o2", answer(`{}`)), modelservice.ErrNotFound, "another owner's request")
	unknown := modelservice.NewRequestID(time.Now())
	assert.ErrorIs(t, b.Respond(ctx, unknown, "o1", answer(`{}`)), modelservice.ErrNotFound)
	_, err := b.Cancel(ctx, unknown, modelservice.End{State: modelservice.StateCancelled})
	assert.ErrorIs(t, err, modelservice.ErrNotFound)
	_, err = b.Await(ctx, unknown)
	assert.ErrorIs(t, err, modelservice.ErrNotFound)
}

func testRespondRace(t *testing.T, b modelservice.Broker, o Options) {
	ctx := ctxT(t)
	req := newRequest("o1", "sbx-a")
	require.NoError(t, b.Submit(ctx, req))
	replicas := []modelservice.Broker{b}
	if o.NewReplica != nil {
		replicas = append(replicas, o.NewReplica(t, b))
	}
	const n = 8
	var (
		wg      sync.WaitGroup
		wins    atomic.Int32
		answers atomic.Int32
		others  []error
		mu      sync.Mutex
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			err := replicas[i%len(replicas)].Respond(ctx, req.ID, "o1", answer(fmt.Sprintf(`{"n":%d}`, i)))
			switch {
			case err == nil:
				wins.Add(1)
			case errors.Is(err, modelservice.ErrAnswered):
				answers.Add(1)
			default:
				mu.Lock()
				others = append(others, err)
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	assert.Empty(t, others)
	assert.Equal(t, int32(1), wins.Load(), "exactly one answer wins")
	assert.Equal(t, int32(n-1), answers.Load())
}

func testCancelAfterAnswer(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	req := newRequest("o1", "sbx-a")
	require.NoError(t, b.Submit(ctx, req))
	require.NoError(t, b.Respond(ctx, req.ID, "o1", answer(`{"late":true}`)))
	r, err := b.Cancel(ctx, req.ID, modelservice.End{State: modelservice.StateExpired, Reason: "timeout"})
	assert.ErrorIs(t, err, modelservice.ErrAnswered)
	assert.Equal(t, `{"late":true}`, string(r.Body), "the answer that won the race comes back")
}

func testCancelIdempotent(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	req := newRequest("o1", "sbx-a")
	require.NoError(t, b.Submit(ctx, req))
	end := modelservice.End{State: modelservice.StateCancelled, Reason: "the agent disconnected"}
	_, err := b.Cancel(ctx, req.ID, end)
	require.NoError(t, err)
	_, err = b.Cancel(ctx, req.ID, modelservice.End{State: modelservice.StateExpired, Reason: "other"})
	require.NoError(t, err)
	page, _, err := b.Transcript(ctx, modelservice.TranscriptQuery{LeaseID: "sbx-a", Limit: 10})
	require.NoError(t, err)
	require.Len(t, page, 1)
	assert.Equal(t, modelservice.StateCancelled, page[0].State, "the first end stands")
	assert.Equal(t, end.Reason, page[0].Reason)
}

func testAwaitCancelled(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	req := newRequest("o1", "sbx-a")
	require.NoError(t, b.Submit(ctx, req))
	done := awaitAsync(ctx, b, req.ID)
	_, err := b.Cancel(ctx, req.ID, modelservice.End{State: modelservice.StateExpired, Reason: "timeout"})
	require.NoError(t, err)
	assert.ErrorIs(t, (<-done).err, modelservice.ErrGone)
}

func testAwaitCtx(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	req := newRequest("o1", "sbx-a")
	require.NoError(t, b.Submit(ctx, req))
	actx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := b.Await(actx, req.ID)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	// The request is untouched: it can still be answered.
	require.NoError(t, b.Respond(ctx, req.ID, "o1", answer(`{}`)))
}

// testAwaitSteps waits as the relay does, in short steps (each Await ends
// with its ctx, the next one starts), while another replica answers: the
// answer reaches a later step, whether it arrived during a step or between
// two.
func testAwaitSteps(t *testing.T, a modelservice.Broker, o Options) {
	ctx := ctxT(t)
	b := a
	if o.NewReplica != nil {
		b = o.NewReplica(t, a)
	}
	for i := 0; i < 3; i++ {
		req := newRequest("o1", "sbx-s")
		require.NoError(t, a.Submit(ctx, req))
		answered := make(chan error, 1)
		go func() {
			time.Sleep(time.Duration(i) * 70 * time.Millisecond)
			answered <- b.Respond(ctx, req.ID, "o1", answer(fmt.Sprintf(`{"step":%d}`, i)))
		}()
		deadline := time.Now().Add(waitLong)
		var (
			resp modelservice.Response
			err  error
		)
		for time.Now().Before(deadline) {
			sctx, cancel := context.WithTimeout(ctx, 40*time.Millisecond)
			resp, err = a.Await(sctx, req.ID)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				break
			}
		}
		require.NoError(t, <-answered)
		require.NoError(t, err, "request %d", i)
		assert.Equal(t, fmt.Sprintf(`{"step":%d}`, i), string(resp.Body))
	}
}

func testTranscript(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	var reqs []modelservice.Request
	for i := 0; i < 5; i++ {
		r := newRequest("o1", "sbx-t")
		require.NoError(t, b.Submit(ctx, r))
		reqs = append(reqs, r)
	}
	require.NoError(t, b.Submit(ctx, newRequest("o1", "sbx-other")))
	got, err := b.Claim(ctx, modelservice.ClaimQuery{Owner: "o1", Pool: "default", Labels: map[string]string{"run": "r1"}, Max: 2, Visibility: time.Minute})
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.NoError(t, b.Respond(ctx, reqs[0].ID, "o1", answer(`{"answer":0}`)))
	_, err = b.Cancel(ctx, reqs[2].ID, modelservice.End{State: modelservice.StateCancelled, Reason: "the agent disconnected"})
	require.NoError(t, err)

	var all []modelservice.Exchange
	after := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10)
		page, more, err := b.Transcript(ctx, modelservice.TranscriptQuery{LeaseID: "sbx-t", After: after, Limit: 2})
		require.NoError(t, err)
		require.LessOrEqual(t, len(page), 2)
		all = append(all, page...)
		if !more {
			break
		}
		require.NotEmpty(t, page)
		after = page[len(page)-1].ID
	}
	require.Len(t, all, 5)
	for i, ex := range all {
		assert.Equal(t, reqs[i].ID, ex.ID, "oldest first")
		assert.Equal(t, reqs[i].Body, ex.Body)
		assert.Equal(t, "sbx-t", ex.LeaseID)
	}
	assert.Equal(t, modelservice.StateAnswered, all[0].State)
	require.NotNil(t, all[0].Response)
	assert.Equal(t, `{"answer":0}`, string(all[0].Response.Body))
	assert.False(t, all[0].EndedAt.IsZero())
	assert.False(t, all[0].ClaimedAt.IsZero())
	assert.Equal(t, modelservice.StateClaimed, all[1].State)
	assert.Equal(t, modelservice.StateCancelled, all[2].State)
	assert.Equal(t, "the agent disconnected", all[2].Reason)
	assert.Nil(t, all[2].Response)
	assert.Equal(t, modelservice.StatePending, all[3].State)

	page, more, err := b.Transcript(ctx, modelservice.TranscriptQuery{LeaseID: "sbx-t", Limit: 10, MaxBytes: 1})
	require.NoError(t, err)
	assert.Len(t, page, 1, "the first exchange comes whatever its size")
	assert.True(t, more)
}

// testTranscriptLimitBelowOne checks TranscriptQuery.Normalized: a Limit
// below 1 returns a page of one exchange.
func testTranscriptLimitBelowOne(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	var reqs []modelservice.Request
	for i := 0; i < 2; i++ {
		r := newRequest("o1", "sbx-t")
		require.NoError(t, b.Submit(ctx, r))
		reqs = append(reqs, r)
	}
	page, more, err := b.Transcript(ctx, modelservice.TranscriptQuery{LeaseID: "sbx-t", Limit: 0})
	require.NoError(t, err)
	require.Len(t, page, 1)
	assert.Equal(t, reqs[0].ID, page[0].ID)
	assert.True(t, more)
	page, more, err = b.Transcript(ctx, modelservice.TranscriptQuery{LeaseID: "sbx-t", After: reqs[0].ID, Limit: -1})
	require.NoError(t, err)
	require.Len(t, page, 1)
	assert.Equal(t, reqs[1].ID, page[0].ID)
	assert.False(t, more)
}

func testTranscriptOwner(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	require.NoError(t, b.Submit(ctx, newRequest("o1", "sbx-a")))
	page, _, err := b.Transcript(ctx, modelservice.TranscriptQuery{LeaseID: "sbx-a", Owner: "o2", Limit: 10})
	require.NoError(t, err)
	assert.Empty(t, page)
	page, _, err = b.Transcript(ctx, modelservice.TranscriptQuery{LeaseID: "sbx-none", Limit: 10})
	require.NoError(t, err)
	assert.Empty(t, page)
}

func testRecord(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	req := newRequest("o1", "sbx-p")
	resp := answer("data: {\"x\":1}\n\ndata: [DONE]\n\n")
	resp.ContentType = "text/event-stream"
	ex := modelservice.Exchange{Request: req, State: modelservice.StateAnswered, Upstream: "http://127.0.0.1:1/v1",
		Response: &resp, EndedAt: time.Now().UTC().Truncate(time.Millisecond), Truncated: true}
	require.NoError(t, b.Record(ctx, ex))
	assert.ErrorIs(t, b.Record(ctx, ex), modelservice.ErrConflict)

	got, err := b.Claim(ctx, claimQuery("o1"))
	require.NoError(t, err)
	assert.Empty(t, got, "a recorded exchange is never offered to trainers")
	assert.ErrorIs(t, b.Respond(ctx, req.ID, "o1", answer(`{}`)), modelservice.ErrAnswered)

	page, more, err := b.Transcript(ctx, modelservice.TranscriptQuery{LeaseID: "sbx-p", Limit: 10})
	require.NoError(t, err)
	assert.False(t, more)
	require.Len(t, page, 1)
	assert.Equal(t, req.Body, page[0].Body)
	assert.Equal(t, ex.Upstream, page[0].Upstream)
	assert.True(t, page[0].Truncated)
	require.NotNil(t, page[0].Response)
	assert.Equal(t, resp.Body, page[0].Response.Body)
	assert.Equal(t, "text/event-stream", page[0].Response.ContentType)
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return b
}

func testLargeBodies(t *testing.T, b modelservice.Broker, o Options) {
	ctx := ctxT(t)
	req := newRequest("o1", "sbx-big")
	req.Body = randomBytes(t, o.LargeBody)
	require.NoError(t, b.Submit(ctx, req))
	got, err := b.Claim(ctx, claimQuery("o1"))
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.True(t, bytes.Equal(req.Body, got[0].Body), "a large request body arrives whole")

	resp := answer("")
	resp.Body = randomBytes(t, o.LargeBody+12345)
	require.NoError(t, b.Respond(ctx, req.ID, "o1", resp))
	r, err := b.Await(ctx, req.ID)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(resp.Body, r.Body), "a large answer arrives whole")

	page, _, err := b.Transcript(ctx, modelservice.TranscriptQuery{LeaseID: "sbx-big", Limit: 10})
	require.NoError(t, err)
	require.Len(t, page, 1)
	assert.True(t, bytes.Equal(req.Body, page[0].Body))
	require.NotNil(t, page[0].Response)
	assert.True(t, bytes.Equal(resp.Body, page[0].Response.Body))
}

func testReplicas(t *testing.T, a modelservice.Broker, o Options) {
	ctx := ctxT(t)
	b := a
	if o.NewReplica != nil {
		b = o.NewReplica(t, a)
	}
	req := newRequest("o1", "sbx-r")
	require.NoError(t, a.Submit(ctx, req))
	done := awaitAsync(ctx, a, req.ID)
	q := claimQuery("o1")
	q.Wait = waitLong
	got, err := b.Claim(ctx, q)
	require.NoError(t, err)
	require.Equal(t, []string{req.ID}, ids(got), "the other replica sees the request")
	require.NoError(t, b.Respond(ctx, req.ID, "o1", answer(`{"from":"b"}`)))
	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, `{"from":"b"}`, string(r.resp.Body), "the answer reaches the first replica")
}

func testClaimRace(t *testing.T, b modelservice.Broker, o Options) {
	ctx := ctxT(t)
	replicas := []modelservice.Broker{b}
	if o.NewReplica != nil {
		replicas = append(replicas, o.NewReplica(t, b))
	}
	want := map[string]bool{}
	for i := 0; i < o.RaceRequests; i++ {
		r := newRequest("o1", fmt.Sprintf("sbx-%d", i%7))
		require.NoError(t, replicas[i%len(replicas)].Submit(ctx, r))
		want[r.ID] = true
	}
	var (
		mu   sync.Mutex
		seen = map[string]int{}
		wg   sync.WaitGroup
		errs []error
	)
	deadline := time.Now().Add(waitLong)
	for i := 0; i < o.RaceClaimers; i++ {
		wg.Add(1)
		go func(br modelservice.Broker) {
			defer wg.Done()
			for time.Now().Before(deadline) {
				q := claimQuery("o1")
				q.Max = 4
				q.Wait = 200 * time.Millisecond
				got, err := br.Claim(ctx, q)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				}
				for _, r := range got {
					seen[r.ID]++
				}
				n := len(seen)
				mu.Unlock()
				if err != nil || n >= len(want) {
					return
				}
			}
		}(replicas[i%len(replicas)])
	}
	wg.Wait()
	require.Empty(t, errs)
	assert.Len(t, seen, len(want), "every request was claimed")
	for id, n := range seen {
		assert.True(t, want[id], "unknown id %s", id)
		assert.Equal(t, 1, n, "request %s claimed %d times within its visibility", id, n)
	}
}

func testClose(t *testing.T, b modelservice.Broker, _ Options) {
	ctx := ctxT(t)
	req := newRequest("o1", "sbx-a")
	require.NoError(t, b.Submit(ctx, req))
	claimDone := make(chan error, 1)
	go func() {
		q := claimQuery("o2")
		q.Wait = waitLong
		_, err := b.Claim(ctx, q)
		claimDone <- err
	}()
	awaitDone := make(chan error, 1)
	go func() {
		_, err := b.Await(ctx, req.ID)
		awaitDone <- err
	}()
	require.NoError(t, b.Close(ctx))
	require.NoError(t, b.Close(ctx), "Close is idempotent")
	// Either the waiters were waiting (ErrClosed) or they started after
	// Close (ErrClosed too).
	assert.ErrorIs(t, <-claimDone, modelservice.ErrClosed)
	assert.ErrorIs(t, <-awaitDone, modelservice.ErrClosed)
}
