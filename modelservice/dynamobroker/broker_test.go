package dynamobroker_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/modelservice"
	"github.com/quarryhq/quarry/modelservice/brokertest"
	"github.com/quarryhq/quarry/modelservice/dynamobroker"
)

var (
	runID    = fmt.Sprintf("%x", time.Now().UnixNano()&0xffffffffff)
	tableSeq atomic.Int64
)

// newClient returns an SDK client from the default chain (AWS_ENDPOINT_URL,
// AWS_REGION, credentials) after checking that the endpoint answers. Its
// callers ask testenv.AWS first.
func newClient(t *testing.T) *dynamodb.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := config.LoadDefaultConfig(ctx)
	require.NoError(t, err, "load the AWS SDK config")
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	c := dynamodb.NewFromConfig(cfg)
	_, err = c.ListTables(ctx, &dynamodb.ListTablesInput{Limit: aws.Int32(1)})
	require.NoError(t, err, "%s=1 but the DynamoDB endpoint (AWS_ENDPOINT_URL=%q) does not answer", testenv.EnvAWS, os.Getenv("AWS_ENDPOINT_URL"))
	return c
}

// freshTable creates a table no other test or run uses and deletes it when
// t ends.
func freshTable(t *testing.T, c *dynamodb.Client) string {
	t.Helper()
	table := fmt.Sprintf("quarry-test-relay-%s-%d", runID, tableSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, dynamobroker.CreateTables(ctx, c, table))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := dynamobroker.DeleteTables(ctx, c, table); err != nil {
			t.Errorf("delete test table: %v", err)
		}
	})
	return table
}

func TestBroker_Conformance(t *testing.T) {
	testenv.AWS(t)
	c := newClient(t)
	open := func(t *testing.T, table string) modelservice.Broker {
		b := dynamobroker.New(dynamobroker.Config{Table: table}, c, nil)
		t.Cleanup(func() { _ = b.Close(context.Background()) })
		return b
	}
	tables := map[modelservice.Broker]string{}
	brokertest.Run(t, func(t *testing.T) modelservice.Broker {
		table := freshTable(t, c)
		b := open(t, table)
		tables[b] = table
		return b
	}, brokertest.Options{
		NewReplica: func(t *testing.T, b modelservice.Broker) modelservice.Broker { return open(t, tables[b]) },
	})
}

// The queue index holds small entries without bodies, spread over the
// owner's shards; the meta item holds no request body either.
func TestBroker_QueueEntriesAreSmallAndSpreadOverShards(t *testing.T) {
	testenv.AWS(t)
	c := newClient(t)
	table := freshTable(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := dynamobroker.New(dynamobroker.Config{Table: table}, c, nil)
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	body := bytes.Repeat([]byte("x"), 5000)
	var ids []string
	for i := range 32 {
		now := time.Now()
		req := modelservice.Request{ID: modelservice.NewRequestID(now.Add(time.Duration(i))), LeaseID: "sbx-a", Owner: "o1", Pool: "default",
			Labels: map[string]string{"run": "r1"}, Route: "chat/completions", Body: body, ReceivedAt: now, Deadline: now.Add(time.Minute)}
		require.NoError(t, b.Submit(ctx, req))
		ids = append(ids, req.ID)
	}
	out, err := c.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(table), IndexName: aws.String("queue-by-shard")})
	require.NoError(t, err)
	require.Len(t, out.Items, 32, "every pending request is queued")
	parts := map[string]int{}
	for _, it := range out.Items {
		for _, attr := range []string{"qb", "ab", "d"} { // inline request body, inline answer, a chunk's data
			assert.NotContains(t, it, attr, "a body in the queue index")
		}
		assert.Less(t, approxSize(it), 1024, "an entry costs one write unit")
		parts[it["qp"].(*types.AttributeValueMemberS).Value]++
	}
	assert.GreaterOrEqual(t, len(parts), 10, "32 requests of one owner over its 16 shards: %v", parts)
	meta, err := c.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "R#" + ids[0]}, "sk": &types.AttributeValueMemberS{Value: "M"}}})
	require.NoError(t, err)
	assert.NotContains(t, meta.Item, "qb", "the request body is not in the meta item")
	assert.Less(t, approxSize(meta.Item), 1024)

	got, err := b.Claim(ctx, modelservice.ClaimQuery{Owner: "o1", Max: 100, Visibility: time.Minute})
	require.NoError(t, err)
	require.Len(t, got, 32)
	for i, r := range got {
		assert.Equal(t, ids[i], r.ID, "oldest first")
		assert.Equal(t, body, r.Body)
	}
}

// approxSize is an item's size as DynamoDB counts it, near enough for
// strings, numbers, binaries and maps of strings.
func approxSize(it map[string]types.AttributeValue) int {
	n := 0
	for k, v := range it {
		n += len(k)
		switch v := v.(type) {
		case *types.AttributeValueMemberS:
			n += len(v.Value)
		case *types.AttributeValueMemberN:
			n += len(v.Value)/2 + 1
		case *types.AttributeValueMemberB:
			n += len(v.Value)
		case *types.AttributeValueMemberM:
			n += 3 + approxSize(v.Value)
		default:
			n++
		}
	}
	return n
}

// firstSchema is the relay table as the first schema made it: the queue
// index keyed by owner alone (qo), with every attribute projected.
func firstSchema(table string) *dynamodb.CreateTableInput {
	def := dynamobroker.TableDefinition(table)
	def.AttributeDefinitions = []types.AttributeDefinition{}
	for _, name := range []string{"pk", "sk", "lease", "rid", "qo", "qk"} {
		def.AttributeDefinitions = append(def.AttributeDefinitions, types.AttributeDefinition{AttributeName: aws.String(name), AttributeType: types.ScalarAttributeTypeS})
	}
	key := func(h, r string) []types.KeySchemaElement {
		return []types.KeySchemaElement{{AttributeName: aws.String(h), KeyType: types.KeyTypeHash}, {AttributeName: aws.String(r), KeyType: types.KeyTypeRange}}
	}
	all := &types.Projection{ProjectionType: types.ProjectionTypeAll}
	def.GlobalSecondaryIndexes = []types.GlobalSecondaryIndex{
		{IndexName: aws.String("by-lease"), KeySchema: key("lease", "rid"), Projection: all},
		{IndexName: aws.String("queue"), KeySchema: key("qo", "qk"), Projection: all},
	}
	return def
}

// CreateTables on a table of the first schema adds the sharded queue
// index and leaves the old one; the broker then serves the table, and a
// request an old gateway wrote (body inline, queued by owner) can still be
// answered, awaited and read, and leaves the old queue when answered.
func TestCreateTables_MigratesATableOfTheFirstSchema(t *testing.T) {
	testenv.AWS(t)
	c := newClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	table := fmt.Sprintf("quarry-test-relay-%s-%d", runID, tableSeq.Add(1))
	_, err := c.CreateTable(ctx, firstSchema(table))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		assert.NoError(t, dynamobroker.DeleteTables(ctx, c, table))
	})
	now := time.Now()
	old := modelservice.NewRequestID(now)
	s := func(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
	num := func(v int64) types.AttributeValue { return &types.AttributeValueMemberN{Value: fmt.Sprint(v)} }
	_, err = c.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
		"pk": s("R#" + old), "sk": s("M"), "rid": s(old), "lease": s("sbx-old"), "owner": s("o1"), "pool": s("default"),
		"labels": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{}}, "route": s("chat/completions"),
		"stream": &types.AttributeValueMemberBOOL{Value: false}, "recv": num(now.UnixMilli()), "deadline": num(now.Add(time.Minute).UnixMilli()),
		"keep": num(now.Add(time.Hour).UnixMilli()), "ttl": num(now.Add(time.Hour).Unix()), "st": s("pending"), "attempt": num(0),
		"repl": s("gone-replica"), "qb": &types.AttributeValueMemberB{Value: []byte(`{"old":true}`)}, "qs": num(12),
		"qo": s("o1"), "qk": s(fmt.Sprintf("%013d#%s", now.UnixMilli(), old)),
	}})
	require.NoError(t, err)

	require.NoError(t, dynamobroker.CreateTables(ctx, c, table))
	require.NoError(t, dynamobroker.CreateTables(ctx, c, table), "again: nothing to do")
	desc, err := c.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
	require.NoError(t, err)
	indexes := map[string]types.IndexStatus{}
	for _, ix := range desc.Table.GlobalSecondaryIndexes {
		indexes[aws.ToString(ix.IndexName)] = ix.IndexStatus
	}
	assert.Equal(t, types.IndexStatusActive, indexes["queue-by-shard"], "the sharded queue was added: %v", indexes)
	assert.Contains(t, indexes, "queue", "the old index is the operator's to delete")

	b := dynamobroker.New(dynamobroker.Config{Table: table}, c, nil)
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	req := modelservice.Request{ID: modelservice.NewRequestID(time.Now()), LeaseID: "sbx-new", Owner: "o1", Pool: "default", Route: "chat/completions",
		Body: []byte(`{"new":true}`), ReceivedAt: now, Deadline: now.Add(time.Minute)}
	require.NoError(t, b.Submit(ctx, req))
	got, err := b.Claim(ctx, modelservice.ClaimQuery{Owner: "o1", Max: 10, Visibility: time.Minute})
	require.NoError(t, err)
	require.Len(t, got, 1, "new gateways claim what they queued (not what old ones queued)")
	assert.Equal(t, req.ID, got[0].ID)

	require.NoError(t, b.Respond(ctx, old, "o1", modelservice.Response{Status: 200, ContentType: "application/json", Body: []byte(`{"a":1}`), AnsweredAt: now}))
	resp, err := b.Await(ctx, old)
	require.NoError(t, err)
	assert.Equal(t, `{"a":1}`, string(resp.Body))
	page, _, err := b.Transcript(ctx, modelservice.TranscriptQuery{LeaseID: "sbx-old", Limit: 10})
	require.NoError(t, err)
	require.Len(t, page, 1)
	assert.Equal(t, `{"old":true}`, string(page[0].Body), "an old item's inline body")
	meta, err := c.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"pk": s("R#" + old), "sk": s("M")}})
	require.NoError(t, err)
	assert.NotContains(t, meta.Item, "qo", "an answered old request leaves the old queue")
}
