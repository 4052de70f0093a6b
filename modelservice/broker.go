package modelservice

import (
	"context"
	"errors"
	"time"
)

// Sentinel errors of the broker contract. Brokers return them (possibly
// wrapped) and translate backend errors to them at the edge; the gateway
// maps them to HTTP answers in one place.
var (
	// ErrNotFound: no such request id (or it belongs to another owner, or
	// its retention has passed).
	ErrNotFound = errors.New("model request not found")
	// ErrAnswered: the request has been answered already.
	ErrAnswered = errors.New("model request already answered")
	// ErrGone: the request ended without an answer: the agent gave up (it
	// disconnected) or its timeout passed.
	ErrGone = errors.New("model request is gone: the agent gave up or it timed out")
	// ErrConflict: a request with this id exists already.
	ErrConflict = errors.New("model request id exists already")
	// ErrFull: the broker holds as much as it may (memory broker); retry
	// later.
	ErrFull = errors.New("model relay is full")
	// ErrUnavailable: the broker's backend cannot be reached or throttled
	// the call; the operation did not happen and may be retried.
	ErrUnavailable = errors.New("model relay broker unavailable")
	// ErrClosed: the broker was closed.
	ErrClosed = errors.New("model relay broker closed")
)

// State is where a model request is in its life.
type State string

const (
	// StatePending: queued, not claimed by a trainer yet.
	StatePending State = "pending"
	// StateClaimed: a trainer claimed it; it is offered again when
	// ClaimedUntil passes without an answer.
	StateClaimed State = "claimed"
	// StateAnswered: a trainer (or, in passthrough, the upstream) answered.
	StateAnswered State = "answered"
	// StateCancelled: the agent disconnected, or its lease ended, before an
	// answer.
	StateCancelled State = "cancelled"
	// StateExpired: no answer arrived within the request's timeout.
	StateExpired State = "expired"
	// StateFailed: passthrough only: the upstream could not be reached or
	// failed mid-answer.
	StateFailed State = "failed"
)

// Ended reports whether s is a final state.
func (s State) Ended() bool {
	return s == StateAnswered || s == StateCancelled || s == StateExpired || s == StateFailed
}

// Request is one call that an agent made to its sandbox's relay.
type Request struct {
	// ID is unique and sorts by creation time (NewRequestID).
	ID string
	// LeaseID is the sandbox the call came from.
	LeaseID string
	// Owner is the owner id of the lease (a hash of the API key that holds
	// it); only that owner claims, answers and reads the request.
	Owner  string
	Pool   string
	Labels map[string]string
	// Route is the OpenAI route under the relay's base URL:
	// "chat/completions" or "completions".
	Route string
	// Stream is the body's "stream": true (the agent wants server-sent
	// events).
	Stream bool
	// Body is the agent's request body, byte for byte.
	Body []byte
	// ReceivedAt is when the gateway received the call; Deadline is when the
	// agent's call times out (the request then ends as expired).
	ReceivedAt time.Time
	Deadline   time.Time
	// Attempt counts the claims of the request, this one included (set by
	// Claim).
	Attempt int
}

// Response is the answer the agent receives.
type Response struct {
	// Status is the HTTP status the agent receives: 200, or 400-599 for an
	// error answer.
	Status int
	// ContentType is "application/json" or "text/event-stream" (an answer
	// that is already a stream of chunks).
	ContentType string
	// Body is the answer's body, byte for byte.
	Body []byte
	// AnsweredAt is when the answer arrived at the gateway.
	AnsweredAt time.Time
}

// Exchange is one entry of a lease's transcript: a request and how it
// ended.
type Exchange struct {
	Request
	State State
	// Reason says why a request ended without an answer.
	Reason string
	// Upstream is the URL that answered a passthrough call ("" when a
	// trainer answered).
	Upstream string
	// Response is set once answered (and for a failed passthrough that got
	// a status).
	Response *Response
	// ClaimedAt is when a trainer last claimed the request; EndedAt when it
	// reached its final state.
	ClaimedAt time.Time
	EndedAt   time.Time
	// Truncated is set when a passthrough answer was longer than the
	// transcript keeps (the agent still received all of it).
	Truncated bool
}

// ClaimQuery selects and claims pending requests.
type ClaimQuery struct {
	// Owner is required: only that owner's requests are claimed.
	Owner string
	// Pool and Labels filter (zero values match everything; every label
	// pair must match).
	Pool   string
	Labels map[string]string
	// Max bounds how many requests one claim returns (below 1: 1, see
	// Normalized).
	Max int
	// MaxBytes bounds the total body size of a batch; the first request is
	// always returned whatever its size. Zero: no bound.
	MaxBytes int64
	// Wait is how long Claim may wait for a first matching request (0:
	// return at once).
	Wait time.Duration
	// Visibility is how long claimed requests stay hidden from other
	// claims; unanswered by then, they are offered again.
	Visibility time.Duration
}

// Normalized returns q as every broker's Claim reads it: Max below 1 is 1.
// Brokers call it first, so that they all answer the same query the same
// way.
func (q ClaimQuery) Normalized() ClaimQuery {
	if q.Max < 1 {
		q.Max = 1
	}
	return q
}

// Matches reports whether a request of pool with labels passes q's pool
// and label filters.
func (q ClaimQuery) Matches(pool string, labels map[string]string) bool {
	if q.Pool != "" && pool != q.Pool {
		return false
	}
	for k, v := range q.Labels {
		if have, ok := labels[k]; !ok || have != v {
			return false
		}
	}
	return true
}

// End says how a request ends without an answer (Cancel).
type End struct {
	State  State // StateCancelled or StateExpired
	Reason string
}

// TranscriptQuery pages through a lease's exchanges, oldest first.
type TranscriptQuery struct {
	LeaseID string
	// Owner, when set, must own the lease's requests (others see nothing).
	Owner string
	// After is the id of the last exchange of the previous page ("" for the
	// first page).
	After string
	// Limit bounds the page (below 1: 1, see Normalized); MaxBytes bounds
	// the page's total body bytes (the first exchange is always returned).
	// Zero: no bound.
	Limit    int
	MaxBytes int64
}

// Normalized returns q as every broker's Transcript reads it: Limit below
// 1 is 1. Brokers call it first.
func (q TranscriptQuery) Normalized() TranscriptQuery {
	if q.Limit < 1 {
		q.Limit = 1
	}
	return q
}

// WithinBytes reports whether one more item of size bytes may join a batch
// of n items holding used bytes, under a MaxBytes bound max (ClaimQuery,
// TranscriptQuery): the first item always may, whatever its size; after
// it the batch must stay within max. Zero max: no bound. Every broker's
// Claim and Transcript batch by it.
func WithinBytes(n int, used, size, max int64) bool {
	return n == 0 || max <= 0 || used+size <= max
}

// Broker queues the relay's requests between the replica that holds an
// agent's call and the replica that serves the trainer's claims and
// answers, and keeps the transcripts. Implementations must be safe for
// concurrent use by many goroutines and, for shared backends, by many
// replicas: every state change is conditional, so a request is answered
// at most once and never after it ended.
//
// The memory broker (modelservice/membroker) is the single-node default;
// the DynamoDB broker (modelservice/dynamobroker) serves replicas;
// modelservice/brokertest is the conformance suite both pass.
type Broker interface {
	// Submit queues req (pending). ErrConflict when req.ID exists; ErrFull
	// when the broker is at its size bound.
	Submit(ctx context.Context, req Request) error
	// Claim returns up to q.Max pending (or claim-expired) requests of
	// q.Owner matching the filters, oldest first, and hides them from other
	// claims for q.Visibility. With none available it waits up to q.Wait
	// for one (or until ctx ends: then it returns what it has, possibly
	// nothing, with a nil error). Requests past their deadline are never
	// returned.
	Claim(ctx context.Context, q ClaimQuery) ([]Request, error)
	// Respond answers request id of owner. ErrNotFound when unknown (or
	// another owner's), ErrAnswered when answered already, ErrGone when it
	// was cancelled or its deadline has passed. Exactly one of concurrent
	// answers succeeds.
	Respond(ctx context.Context, id, owner string, resp Response) error
	// Await waits until request id ends and returns its answer; ErrGone
	// when it ended without one, ErrNotFound when unknown. It returns
	// ctx's error when ctx ends first (the request stays as it is).
	Await(ctx context.Context, id string) (Response, error)
	// Cancel ends a pending or claimed request without an answer.
	// ErrAnswered, with the answer, when it was answered first (the caller
	// may still deliver it); nil when it had ended without an answer
	// already (idempotent); ErrNotFound when unknown.
	Cancel(ctx context.Context, id string, end End) (Response, error)
	// Record stores an exchange that ended already (a passthrough call) in
	// its lease's transcript. ErrConflict when its id exists.
	Record(ctx context.Context, ex Exchange) error
	// Transcript returns a page of the lease's exchanges, oldest first,
	// with request and answer bodies, and whether more follow. Exchanges
	// are kept for the broker's retention after their request's deadline;
	// older ones are not returned.
	Transcript(ctx context.Context, q TranscriptQuery) (page []Exchange, more bool, err error)
	// Close releases the broker's resources and stops its background work;
	// waiting calls return ErrClosed. It is safe to call more than once.
	Close(ctx context.Context) error
}

// Purger is an optional Broker capability: Purge deletes the exchanges
// whose retention has passed and returns how many it deleted. Brokers
// whose backend expires items by itself (DynamoDB's TTL) do not need it.
type Purger interface {
	Purge(ctx context.Context) (int, error)
}
