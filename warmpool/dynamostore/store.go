package dynamostore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"golang.org/x/sync/singleflight"

	"github.com/quarryhq/quarry/warmpool"
)

const (
	// maxRounds bounds the read-decide-write rounds of one operation that
	// lost races (each lost round means another writer made progress).
	maxRounds = 64
	// batchGetMax is DynamoDB's limit of keys per BatchGetItem.
	batchGetMax = 100
	// maxTransactItems is DynamoDB's limit of items per TransactWriteItems.
	maxTransactItems = 100
	// backoffBase and backoffMax shape the pause after a retryable race
	// (TransactionConflict, unprocessed keys).
	backoffBase = 5 * time.Millisecond
	backoffMax  = 500 * time.Millisecond
	// fanOut bounds the concurrent calls of one operation over shards.
	fanOut = 8
	// emptyHint is how long after a sweep found a pool empty its claims go
	// straight to a sweep of every shard instead of trying one first.
	emptyHint = time.Second
)

// Store is the DynamoDB lease store. It keeps nothing in memory that
// matters (only call counters): any number of Store values, on any number
// of replicas, may share the tables. Safe for concurrent use.
type Store struct {
	cfg    Config
	db     *ddb
	closed atomic.Bool
	// sweeps coalesces concurrent sweeps of one pool's ready index;
	// sweeping counts the sweeps under way by pool and emptyAt holds when
	// the last sweep of a pool found it empty (both under sweepMu).
	sweeps   singleflight.Group
	sweepMu  sync.Mutex
	sweeping map[string]int
	emptyAt  map[string]time.Time
}

var _ warmpool.Store = (*Store)(nil)

// New returns a store on cfg's tables through api (a *dynamodb.Client, or
// anything with its methods). It makes no call: the tables must exist
// (CreateTables, or the LocalStack hook). It fails when cfg is invalid.
func New(api API, cfg Config) (*Store, error) {
	if api == nil {
		return nil, errors.New("new DynamoDB lease store: api is nil")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new DynamoDB lease store: %w", err)
	}
	return &Store{cfg: cfg, db: &ddb{api: api, calls: newCallCounter(), timeout: cfg.CallTimeout}, sweeping: map[string]int{}, emptyAt: map[string]time.Time{}}, nil
}

// Calls returns how many DynamoDB API calls this Store made, by operation
// name ("GetItem", "Query", "TransactWriteItems", ...). The SDK's own
// retries of one call count once. Safe for concurrent use.
func (s *Store) Calls() map[string]int64 { return s.db.calls.snapshot() }

// Close makes later calls return warmpool.ErrClosed. The SDK client is the
// caller's and stays open. Closing twice returns nil.
func (s *Store) Close() error {
	s.closed.Store(true)
	return nil
}

// begin checks that the store is open and ctx alive before an operation.
func (s *Store) begin(ctx context.Context, action string) error {
	if s.closed.Load() {
		return fmt.Errorf("%s: %w", action, warmpool.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", action, err)
	}
	return nil
}

// now is the time for TTL checks of reads that are given none.
func (s *Store) now() time.Time { return s.cfg.Clock.Now() }

// backoff pauses before retry round (0-based) of a lost race, with jitter.
func backoff(ctx context.Context, round int) error {
	d := min(backoffMax, backoffBase<<min(round, 10))
	return sleep(ctx, d/2+randDuration(d/2))
}

// requestToken returns a fresh ClientRequestToken: the SDK's retries of
// one TransactWriteItems carry it, so a retry of a transaction that did
// commit (its answer lost) succeeds instead of failing its conditions.
func requestToken() *string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails
	return ptr(hex.EncodeToString(b[:]))
}

// getItem reads one item with a strongly consistent read; nil when absent.
func (s *Store) getItem(ctx context.Context, table, pk string) (item, error) {
	out, err := s.db.getItem(ctx, &dynamodb.GetItemInput{TableName: &table, Key: key(pk), ConsistentRead: ref(true)})
	if err != nil {
		return nil, err
	}
	if len(out.Item) == 0 {
		return nil, nil
	}
	return out.Item, nil
}

// batchGet reads the items of pks (strongly consistent), in batches of
// 100, retrying unprocessed keys with backoff. Missing items are absent
// from the result, which is keyed by pk.
func (s *Store) batchGet(ctx context.Context, table string, pks []string) (map[string]item, error) {
	out := make(map[string]item, len(pks))
	for start := 0; start < len(pks); start += batchGetMax {
		keys := make([]item, 0, batchGetMax)
		for _, pk := range pks[start:min(start+batchGetMax, len(pks))] {
			keys = append(keys, key(pk))
		}
		req := map[string]types.KeysAndAttributes{table: {Keys: keys, ConsistentRead: ref(true)}}
		for round := 0; len(req) > 0; round++ {
			if round > 0 {
				if round >= maxRounds {
					return nil, fmt.Errorf("batch get from %s: keys still unprocessed after %d rounds: %w", table, round, warmpool.ErrUnavailable)
				}
				if err := backoff(ctx, round); err != nil {
					return nil, err
				}
			}
			res, err := s.db.batchGet(ctx, &dynamodb.BatchGetItemInput{RequestItems: req})
			if err != nil {
				return nil, err
			}
			for _, it := range res.Responses[table] {
				out[pkOf(it)] = it
			}
			req = res.UnprocessedKeys
		}
	}
	return out, nil
}

// queryKeys returns the table keys (pk) an index holds under partition
// key pk, in index order, with every page read. cond and vals narrow the
// sort key; limit > 0 stops after that many.
func (s *Store) queryKeys(ctx context.Context, in dynamodb.QueryInput, limit int) ([]string, error) {
	var pks []string
	for {
		if limit > 0 {
			in.Limit = ref(int32(min(limit-len(pks), 1000)))
		}
		out, err := s.db.query(ctx, &in)
		if err != nil {
			return nil, err
		}
		for _, it := range out.Items {
			pks = append(pks, pkOf(it))
		}
		if len(out.LastEvaluatedKey) == 0 || limit > 0 && len(pks) >= limit {
			return pks, nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// scanAll reads every item of table whose pk starts with prefix
// (strongly consistent), page by page.
func (s *Store) scanAll(ctx context.Context, table, prefix string) ([]item, error) {
	e := newExpr()
	filter := "begins_with(" + e.n(attrPK) + ", " + e.v(avS(prefix)) + ")"
	in := &dynamodb.ScanInput{TableName: &table, ConsistentRead: ref(true), FilterExpression: &filter,
		ExpressionAttributeNames: e.Names(), ExpressionAttributeValues: e.Values()}
	var items []item
	for {
		out, err := s.db.scan(ctx, in)
		if err != nil {
			return nil, err
		}
		items = append(items, out.Items...)
		if len(out.LastEvaluatedKey) == 0 {
			return items, nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}
