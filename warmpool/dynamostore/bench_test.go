package dynamostore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/warmpool"
	"github.com/quarryhq/quarry/warmpool/dynamostore"
	"github.com/quarryhq/quarry/warmpool/storetest"
)

// BenchmarkStore_Claim measures one warm claim (the store's share of a warm
// acquire: p50_ms, p99_ms) beside one raw conditional PutItem on the same
// endpoint in the same run (put_p50_ms, put_p99_ms), and the DynamoDB
// calls per claim (calls/claim). Needs a DynamoDB endpoint, like the tests (testenv.AWS).
func BenchmarkStore_Claim(b *testing.B) {
	testenv.AWS(b)
	client := newClient(b)
	// The emulator can stall for seconds (its transactions copy the tables).
	cfg := freshTables(b, client, dynamostore.Config{CallTimeout: time.Minute})
	s, err := dynamostore.New(client, cfg)
	require.NoError(b, err)
	now := time.Now().UTC()
	const pool = "bench"
	// Twice as many ready tasks as claims: no shard runs empty, so every
	// claim is a warm one (an empty shard would send it to a sweep).
	recs := make([]warmpool.TaskRecord, 2*b.N)
	for i := range recs {
		recs[i] = warmpool.TaskRecord{ID: warmpool.NewTaskID(), Provider: "fake", CreatedAt: now}
	}
	for start := 0; start < len(recs); start += 50 {
		require.NoError(b, s.ReserveTasks(b.Context(), pool, len(recs), recs[start:min(start+50, len(recs))]))
	}
	for _, r := range recs {
		r.Pool, r.State, r.Version = pool, warmpool.TaskReady, 1
		r.AgentURL, r.AgentToken = "http://127.0.0.1:1", "token"
		_, err := s.UpdateTask(b.Context(), r, warmpool.TaskLaunching)
		require.NoError(b, err)
	}
	before := s.Calls()
	claims := make([]time.Duration, 0, b.N)
	puts := make([]time.Duration, 0, b.N)
	cond := "attribute_not_exists(pk)"
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		_, err := s.Claim(b.Context(), warmpool.ClaimRequest{Pool: pool, Now: now, Lease: warmpool.Lease{
			ID: warmpool.NewLeaseID(), Owner: "owner", Duration: time.Minute, ExpiresAt: now.Add(time.Minute),
			IdempotencyKey: warmpool.NewLeaseID(), Labels: map[string]string{"run": "bench"},
		}})
		claims = append(claims, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		_, err = client.PutItem(b.Context(), &dynamodb.PutItemInput{TableName: aws.String(cfg.LeasesTable),
			ConditionExpression: &cond, Item: map[string]types.AttributeValue{
				"pk": &types.AttributeValueMemberS{Value: fmt.Sprintf("bench#%d", i)},
				"v":  &types.AttributeValueMemberN{Value: "1"},
			}})
		puts = append(puts, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	after := s.Calls()
	var calls int64
	for op, n := range after {
		calls += n - before[op]
	}
	storetest.ReportLatency(b, claims)
	storetest.ReportLatencyAs(b, "put", puts)
	b.ReportMetric(float64(calls)/float64(b.N), "calls/claim")
}
