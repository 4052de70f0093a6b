package ddbsim_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/bench/ddbsim"
	"github.com/quarryhq/quarry/bench/ddbsim/ddbsimtest"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// start runs a simulator for t; the client tries each call once, so
// throttling shows instead of being retried.
func start(t *testing.T, cfg ddbsim.Config) (*dynamodb.Client, *ddbsim.Server, string) {
	t.Helper()
	url, sim := ddbsimtest.Start(t, cfg)
	return ddbsim.Client(url, 1), sim, url
}

func s(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
func n(v int) types.AttributeValue    { return &types.AttributeValueMemberN{Value: fmt.Sprint(v)} }

// makeTable creates table "tbl": pk (S) + sk (S), with index "by-g" on g (S)
// + gs (N), projecting ALL, and "keys" on k (S), KEYS_ONLY.
func makeTable(t *testing.T, c *dynamodb.Client) {
	t.Helper()
	str := func(name string, typ types.ScalarAttributeType) types.AttributeDefinition {
		return types.AttributeDefinition{AttributeName: aws.String(name), AttributeType: typ}
	}
	key := func(hash, rng string) []types.KeySchemaElement {
		ks := []types.KeySchemaElement{{AttributeName: aws.String(hash), KeyType: types.KeyTypeHash}}
		if rng != "" {
			ks = append(ks, types.KeySchemaElement{AttributeName: aws.String(rng), KeyType: types.KeyTypeRange})
		}
		return ks
	}
	out, err := c.CreateTable(t.Context(), &dynamodb.CreateTableInput{
		TableName: aws.String("tbl"), BillingMode: types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{str("pk", "S"), str("sk", "S"), str("g", "S"), str("gs", "N"), str("k", "S")},
		KeySchema:            key("pk", "sk"),
		GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{
			{IndexName: aws.String("by-g"), KeySchema: key("g", "gs"), Projection: &types.Projection{ProjectionType: types.ProjectionTypeAll}},
			{IndexName: aws.String("keys"), KeySchema: key("k", ""), Projection: &types.Projection{ProjectionType: types.ProjectionTypeKeysOnly}},
		},
	})
	require.NoError(t, err)
	assert.Equal(t, types.TableStatusCreating, out.TableDescription.TableStatus, "CreateTable answers CREATING, as on AWS")
	d, err := c.DescribeTable(t.Context(), &dynamodb.DescribeTableInput{TableName: aws.String("tbl")})
	require.NoError(t, err)
	assert.Equal(t, types.TableStatusActive, d.Table.TableStatus)
	require.Len(t, d.Table.GlobalSecondaryIndexes, 2)
}

func put(t *testing.T, c *dynamodb.Client, it map[string]types.AttributeValue) {
	t.Helper()
	_, err := c.PutItem(t.Context(), &dynamodb.PutItemInput{TableName: aws.String("tbl"), Item: it})
	require.NoError(t, err)
}

func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

func TestServer_ItemRoundTrip(t *testing.T) {
	c, _, _ := start(t, ddbsim.Config{})
	makeTable(t, c)
	key := map[string]types.AttributeValue{"pk": s("a"), "sk": s("1")}
	put(t, c, map[string]types.AttributeValue{"pk": s("a"), "sk": s("1"), "n": n(5), "state": s("on"),
		"m": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"x": n(1)}}, "e": &types.AttributeValueMemberB{Value: []byte{}}})
	got, err := c.GetItem(t.Context(), &dynamodb.GetItemInput{TableName: aws.String("tbl"), Key: key, ConsistentRead: aws.Bool(true),
		ProjectionExpression: aws.String("n, m.x, #st, e"), ExpressionAttributeNames: map[string]string{"#st": "state"}})
	require.NoError(t, err)
	assert.Equal(t, map[string]types.AttributeValue{"n": n(5), "state": s("on"), "e": &types.AttributeValueMemberB{Value: []byte{}},
		"m": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"x": n(1)}}}, got.Item, "an empty binary comes back empty, not absent")

	up, err := c.UpdateItem(t.Context(), &dynamodb.UpdateItemInput{TableName: aws.String("tbl"), Key: key,
		UpdateExpression: aws.String("SET n = n + :one, added = :v REMOVE m"), ConditionExpression: aws.String("n = :five"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":one": n(1), ":v": s("v"), ":five": n(5)},
		ReturnValues:              types.ReturnValueUpdatedNew})
	require.NoError(t, err)
	assert.Equal(t, map[string]types.AttributeValue{"n": n(6), "added": s("v")}, up.Attributes)

	del, err := c.DeleteItem(t.Context(), &dynamodb.DeleteItemInput{TableName: aws.String("tbl"), Key: key, ReturnValues: types.ReturnValueAllOld})
	require.NoError(t, err)
	assert.Equal(t, n(6), del.Attributes["n"])
	got, err = c.GetItem(t.Context(), &dynamodb.GetItemInput{TableName: aws.String("tbl"), Key: key})
	require.NoError(t, err)
	assert.Empty(t, got.Item)

	// UpdateItem creates what it does not find.
	_, err = c.UpdateItem(t.Context(), &dynamodb.UpdateItemInput{TableName: aws.String("tbl"), Key: key,
		UpdateExpression: aws.String("ADD hits :one"), ExpressionAttributeValues: map[string]types.AttributeValue{":one": n(1)}})
	require.NoError(t, err)
	got, err = c.GetItem(t.Context(), &dynamodb.GetItemInput{TableName: aws.String("tbl"), Key: key})
	require.NoError(t, err)
	assert.Equal(t, map[string]types.AttributeValue{"pk": s("a"), "sk": s("1"), "hits": n(1)}, got.Item)
}

func TestServer_ConditionFailed_ReturnsTheItemWhenAsked(t *testing.T) {
	c, _, _ := start(t, ddbsim.Config{})
	makeTable(t, c)
	it := map[string]types.AttributeValue{"pk": s("a"), "sk": s("1"), "v": n(1)}
	in := &dynamodb.PutItemInput{TableName: aws.String("tbl"), Item: it, ConditionExpression: aws.String("attribute_not_exists(pk)")}
	_, err := c.PutItem(t.Context(), in)
	require.NoError(t, err)

	_, err = c.PutItem(t.Context(), in)
	var ccf *types.ConditionalCheckFailedException
	require.ErrorAs(t, err, &ccf)
	assert.Equal(t, "The conditional request failed", ccf.ErrorMessage())
	assert.Empty(t, ccf.Item, "no item unless asked for")

	in.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
	_, err = c.PutItem(t.Context(), in)
	require.ErrorAs(t, err, &ccf)
	assert.Equal(t, it, ccf.Item)
}

func TestServer_Transaction_AllOrNothingWithReasonsPerAction(t *testing.T) {
	c, _, _ := start(t, ddbsim.Config{})
	makeTable(t, c)
	old := map[string]types.AttributeValue{"pk": s("a"), "sk": s("1"), "v": n(1)}
	put(t, c, old)
	fresh := map[string]types.AttributeValue{"pk": s("b"), "sk": s("1")}
	_, err := c.TransactWriteItems(t.Context(), &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Put: &types.Put{TableName: aws.String("tbl"), Item: fresh, ConditionExpression: aws.String("attribute_not_exists(pk)")}},
		{Update: &types.Update{TableName: aws.String("tbl"), Key: map[string]types.AttributeValue{"pk": s("a"), "sk": s("1")},
			UpdateExpression: aws.String("SET v = :two"), ConditionExpression: aws.String("v = :two"),
			ExpressionAttributeValues:           map[string]types.AttributeValue{":two": n(2)},
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld}},
		{ConditionCheck: &types.ConditionCheck{TableName: aws.String("tbl"), Key: map[string]types.AttributeValue{"pk": s("c"), "sk": s("1")},
			ConditionExpression: aws.String("attribute_not_exists(pk)")}},
	}})
	var tce *types.TransactionCanceledException
	require.ErrorAs(t, err, &tce)
	assert.Equal(t, "Transaction cancelled, please refer cancellation reasons for specific reasons [None, ConditionalCheckFailed, None]", tce.ErrorMessage())
	require.Len(t, tce.CancellationReasons, 3)
	assert.Equal(t, "None", aws.ToString(tce.CancellationReasons[0].Code))
	assert.Equal(t, "ConditionalCheckFailed", aws.ToString(tce.CancellationReasons[1].Code))
	assert.Equal(t, "The conditional request failed", aws.ToString(tce.CancellationReasons[1].Message))
	assert.Equal(t, old, tce.CancellationReasons[1].Item)
	assert.Equal(t, "None", aws.ToString(tce.CancellationReasons[2].Code))

	got, err := c.GetItem(t.Context(), &dynamodb.GetItemInput{TableName: aws.String("tbl"), Key: fresh})
	require.NoError(t, err)
	assert.Empty(t, got.Item, "a cancelled transaction writes nothing")

	_, err = c.TransactWriteItems(t.Context(), &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Put: &types.Put{TableName: aws.String("tbl"), Item: fresh}},
		{Delete: &types.Delete{TableName: aws.String("tbl"), Key: map[string]types.AttributeValue{"pk": s("a"), "sk": s("1")}}},
	}})
	require.NoError(t, err)
	got, err = c.GetItem(t.Context(), &dynamodb.GetItemInput{TableName: aws.String("tbl"), Key: fresh})
	require.NoError(t, err)
	assert.NotEmpty(t, got.Item)
}

func TestServer_Transaction_ClientRequestTokenIsIdempotent(t *testing.T) {
	c, _, _ := start(t, ddbsim.Config{})
	makeTable(t, c)
	in := func(v int) *dynamodb.TransactWriteItemsInput {
		return &dynamodb.TransactWriteItemsInput{ClientRequestToken: aws.String("tok-1"), TransactItems: []types.TransactWriteItem{
			{Put: &types.Put{TableName: aws.String("tbl"), Item: map[string]types.AttributeValue{"pk": s("a"), "sk": s("1"), "v": n(v)},
				ConditionExpression: aws.String("attribute_not_exists(pk)")}},
		}}
	}
	_, err := c.TransactWriteItems(t.Context(), in(1))
	require.NoError(t, err)
	_, err = c.TransactWriteItems(t.Context(), in(1))
	require.NoError(t, err, "a retry of a committed transaction succeeds, though its condition would now fail")
	_, err = c.TransactWriteItems(t.Context(), in(2))
	var mismatch *types.IdempotentParameterMismatchException
	require.ErrorAs(t, err, &mismatch)
}

func TestServer_Limits_RefusedWithValidationException(t *testing.T) {
	c, _, _ := start(t, ddbsim.Config{})
	makeTable(t, c)
	key := func(i int) map[string]types.AttributeValue {
		return map[string]types.AttributeValue{"pk": s(fmt.Sprint(i)), "sk": s("1")}
	}
	tests := []struct {
		name string
		call func() error
		want string
	}{
		{"a transaction of 101 actions", func() error {
			var items []types.TransactWriteItem
			for i := range 101 {
				items = append(items, types.TransactWriteItem{Put: &types.Put{TableName: aws.String("tbl"), Item: key(i)}})
			}
			_, err := c.TransactWriteItems(t.Context(), &dynamodb.TransactWriteItemsInput{TransactItems: items})
			return err
		}, "Member must have length less than or equal to 100"},
		{"two actions on one item", func() error {
			_, err := c.TransactWriteItems(t.Context(), &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
				{Put: &types.Put{TableName: aws.String("tbl"), Item: key(1)}}, {Delete: &types.Delete{TableName: aws.String("tbl"), Key: key(1)}}}})
			return err
		}, "Transaction request cannot include multiple operations on one item"},
		{"a batch of 26 writes", func() error {
			var reqs []types.WriteRequest
			for i := range 26 {
				reqs = append(reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: key(i)}})
			}
			_, err := c.BatchWriteItem(t.Context(), &dynamodb.BatchWriteItemInput{RequestItems: map[string][]types.WriteRequest{"tbl": reqs}})
			return err
		}, "Member must have length less than or equal to 25"},
		{"a batch of 101 keys", func() error {
			var keys []map[string]types.AttributeValue
			for i := range 101 {
				keys = append(keys, key(i))
			}
			_, err := c.BatchGetItem(t.Context(), &dynamodb.BatchGetItemInput{RequestItems: map[string]types.KeysAndAttributes{"tbl": {Keys: keys}}})
			return err
		}, "Too many items requested for the BatchGetItem call"},
		{"an item over 400 KB", func() error {
			it := key(1)
			it["big"] = s(strings.Repeat("x", 400*1024))
			_, err := c.PutItem(t.Context(), &dynamodb.PutItemInput{TableName: aws.String("tbl"), Item: it})
			return err
		}, "Item size has exceeded the maximum allowed size"},
		{"an update of a key attribute", func() error {
			_, err := c.UpdateItem(t.Context(), &dynamodb.UpdateItemInput{TableName: aws.String("tbl"), Key: key(1),
				UpdateExpression: aws.String("SET sk = :v"), ExpressionAttributeValues: map[string]types.AttributeValue{":v": s("2")}})
			return err
		}, "Cannot update attribute sk. This attribute is part of the key"},
		{"a key of the wrong type", func() error {
			_, err := c.GetItem(t.Context(), &dynamodb.GetItemInput{TableName: aws.String("tbl"), Key: map[string]types.AttributeValue{"pk": n(1), "sk": s("1")}})
			return err
		}, "The provided key element does not match the schema"},
		{"an index key of the wrong type", func() error {
			it := key(1)
			it["gs"] = s("not a number")
			_, err := c.PutItem(t.Context(), &dynamodb.PutItemInput{TableName: aws.String("tbl"), Item: it})
			return err
		}, "Type mismatch for Index Key gs Expected: N Actual: S IndexName: by-g"},
		{"a consistent read of an index", func() error {
			_, err := c.Query(t.Context(), &dynamodb.QueryInput{TableName: aws.String("tbl"), IndexName: aws.String("by-g"), ConsistentRead: aws.Bool(true),
				KeyConditionExpression: aws.String("g = :g"), ExpressionAttributeValues: map[string]types.AttributeValue{":g": s("x")}})
			return err
		}, "Consistent reads are not supported on global secondary indexes"},
		{"a legacy parameter", func() error {
			_, err := c.PutItem(t.Context(), &dynamodb.PutItemInput{TableName: aws.String("tbl"), Item: key(1),
				Expected: map[string]types.ExpectedAttributeValue{"pk": {Exists: aws.Bool(false)}}})
			return err
		}, "does not simulate the legacy parameter Expected"},
		{"re-enabling TTL", func() error {
			spec := &types.TimeToLiveSpecification{AttributeName: aws.String("ttl"), Enabled: aws.Bool(true)}
			if _, err := c.UpdateTimeToLive(t.Context(), &dynamodb.UpdateTimeToLiveInput{TableName: aws.String("tbl"), TimeToLiveSpecification: spec}); err != nil {
				return err
			}
			_, err := c.UpdateTimeToLive(t.Context(), &dynamodb.UpdateTimeToLiveInput{TableName: aws.String("tbl"), TimeToLiveSpecification: spec})
			return err
		}, "TimeToLive is already enabled"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			require.Error(t, err)
			assert.Equal(t, "ValidationException", apiCode(err), "%v", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	_, err := c.GetItem(t.Context(), &dynamodb.GetItemInput{TableName: aws.String("nope"), Key: key(1)})
	var rnf *types.ResourceNotFoundException
	require.ErrorAs(t, err, &rnf)
}

func TestServer_IndexesLag(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_900_000_000, 0)}
	c, _, _ := start(t, ddbsim.Config{Clock: clock, IndexLag: 50 * time.Millisecond})
	makeTable(t, c)
	put(t, c, map[string]types.AttributeValue{"pk": s("a"), "sk": s("1"), "g": s("G"), "gs": n(1), "k": s("K"), "other": s("x")})
	query := func(index, attr, v string) []map[string]types.AttributeValue {
		out, err := c.Query(t.Context(), &dynamodb.QueryInput{TableName: aws.String("tbl"), IndexName: aws.String(index),
			KeyConditionExpression: aws.String(attr + " = :v"), ExpressionAttributeValues: map[string]types.AttributeValue{":v": s(v)}})
		require.NoError(t, err)
		return out.Items
	}
	assert.Empty(t, query("by-g", "g", "G"), "the index does not show the write yet")
	got, err := c.GetItem(t.Context(), &dynamodb.GetItemInput{TableName: aws.String("tbl"), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"pk": s("a"), "sk": s("1")}})
	require.NoError(t, err)
	assert.NotEmpty(t, got.Item, "a strong read of the table is current")
	clock.add(50 * time.Millisecond)
	require.Len(t, query("by-g", "g", "G"), 1)
	keysOnly := query("keys", "k", "K")
	require.Len(t, keysOnly, 1)
	assert.Equal(t, map[string]types.AttributeValue{"pk": s("a"), "sk": s("1"), "k": s("K")}, keysOnly[0], "KEYS_ONLY projects the keys")

	_, err = c.DeleteItem(t.Context(), &dynamodb.DeleteItemInput{TableName: aws.String("tbl"), Key: map[string]types.AttributeValue{"pk": s("a"), "sk": s("1")}})
	require.NoError(t, err)
	assert.Len(t, query("by-g", "g", "G"), 1, "nor the delete")
	clock.add(50 * time.Millisecond)
	assert.Empty(t, query("by-g", "g", "G"))
}

func TestServer_Query_OrdersPagesAndNarrows(t *testing.T) {
	c, _, _ := start(t, ddbsim.Config{IndexLag: -1})
	makeTable(t, c)
	for i := range 10 {
		put(t, c, map[string]types.AttributeValue{"pk": s("p"), "sk": s(fmt.Sprintf("a%02d", i)), "g": s("G"), "gs": n(9 - i)})
	}
	put(t, c, map[string]types.AttributeValue{"pk": s("p"), "sk": s("b00")})
	put(t, c, map[string]types.AttributeValue{"pk": s("other"), "sk": s("a00")})
	collect := func(in dynamodb.QueryInput, attr string) []string {
		var got []string
		for pages := 0; ; pages++ {
			require.Less(t, pages, 20)
			out, err := c.Query(t.Context(), &in)
			require.NoError(t, err)
			for _, it := range out.Items {
				switch v := it[attr].(type) {
				case *types.AttributeValueMemberS:
					got = append(got, v.Value)
				case *types.AttributeValueMemberN:
					got = append(got, v.Value)
				}
			}
			if len(out.LastEvaluatedKey) == 0 {
				return got
			}
			in.ExclusiveStartKey = out.LastEvaluatedKey
		}
	}
	vals := map[string]types.AttributeValue{":p": s("p"), ":pre": s("a0"), ":lo": s("a03"), ":hi": s("a05")}
	q := dynamodb.QueryInput{TableName: aws.String("tbl"), KeyConditionExpression: aws.String("pk = :p AND begins_with(sk, :pre)"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":p": vals[":p"], ":pre": vals[":pre"]}, Limit: aws.Int32(3)}
	assert.Equal(t, []string{"a00", "a01", "a02", "a03", "a04", "a05", "a06", "a07", "a08", "a09"}, collect(q, "sk"), "pages of 3, in order")
	q.ScanIndexForward = aws.Bool(false)
	assert.Equal(t, []string{"a09", "a08", "a07", "a06", "a05", "a04", "a03", "a02", "a01", "a00"}, collect(q, "sk"), "backwards")
	between := dynamodb.QueryInput{TableName: aws.String("tbl"), KeyConditionExpression: aws.String("pk = :p AND sk BETWEEN :lo AND :hi"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":p": vals[":p"], ":lo": vals[":lo"], ":hi": vals[":hi"]}}
	assert.Equal(t, []string{"a03", "a04", "a05"}, collect(between, "sk"))
	index := dynamodb.QueryInput{TableName: aws.String("tbl"), IndexName: aws.String("by-g"), KeyConditionExpression: aws.String("g = :g AND gs < :three"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":g": s("G"), ":three": n(3)}, Limit: aws.Int32(2)}
	assert.Equal(t, []string{"0", "1", "2"}, collect(index, "gs"), "an index in its own sort order")

	count, err := c.Query(t.Context(), &dynamodb.QueryInput{TableName: aws.String("tbl"), KeyConditionExpression: aws.String("pk = :p"),
		FilterExpression: aws.String("attribute_exists(gs)"), Select: types.SelectCount, ExpressionAttributeValues: map[string]types.AttributeValue{":p": s("p")}})
	require.NoError(t, err)
	assert.Equal(t, int32(10), count.Count)
	assert.Equal(t, int32(11), count.ScannedCount, "the filter runs after the read")
	assert.Empty(t, count.Items)
}

func TestServer_Scan_SegmentsCoverEveryItemOnce(t *testing.T) {
	c, _, _ := start(t, ddbsim.Config{})
	makeTable(t, c)
	want := map[string]bool{}
	for i := range 200 {
		id := fmt.Sprintf("p%03d", i)
		put(t, c, map[string]types.AttributeValue{"pk": s(id), "sk": s("x")})
		want[id] = true
	}
	got := map[string]int{}
	for seg := range 4 {
		var start map[string]types.AttributeValue
		for {
			out, err := c.Scan(t.Context(), &dynamodb.ScanInput{TableName: aws.String("tbl"), Segment: aws.Int32(int32(seg)), TotalSegments: aws.Int32(4),
				Limit: aws.Int32(17), ExclusiveStartKey: start, ConsistentRead: aws.Bool(true)})
			require.NoError(t, err)
			for _, it := range out.Items {
				got[it["pk"].(*types.AttributeValueMemberS).Value]++
			}
			if len(out.LastEvaluatedKey) == 0 {
				break
			}
			start = out.LastEvaluatedKey
		}
	}
	require.Len(t, got, len(want))
	for id, k := range got {
		assert.True(t, want[id])
		assert.Equal(t, 1, k, id)
	}
}

func TestServer_HotKeyThrottled(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_900_000_000, 0)}
	c, sim, _ := start(t, ddbsim.Config{Clock: clock, PartitionWriteUnits: 10})
	makeTable(t, c)
	write := func(pk string, i int) error {
		_, err := c.PutItem(t.Context(), &dynamodb.PutItemInput{TableName: aws.String("tbl"),
			Item: map[string]types.AttributeValue{"pk": s(pk), "sk": s(fmt.Sprint(i))}})
		return err
	}
	for i := range 10 {
		require.NoError(t, write("hot", i), "within the key's 10 units a second")
	}
	err := write("hot", 10)
	var pte *types.ProvisionedThroughputExceededException
	require.ErrorAs(t, err, &pte)
	require.Len(t, pte.ThrottlingReasons, 1)
	assert.Equal(t, "TableWriteKeyRangeThroughputExceeded", aws.ToString(pte.ThrottlingReasons[0].Reason))
	assert.Equal(t, "arn:aws:dynamodb:us-east-1:000000000000:table/tbl", aws.ToString(pte.ThrottlingReasons[0].Resource))
	require.NoError(t, write("cold", 0), "another key has its own partition")
	clock.add(time.Second)
	require.NoError(t, write("hot", 11), "the bucket refills")
	assert.Equal(t, int64(1), sim.Stats().Operations["PutItem"].Throttled)
}

func TestServer_TableQuotaThrottled(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_900_000_000, 0)}
	c, _, _ := start(t, ddbsim.Config{Clock: clock, TableWriteUnits: 3})
	makeTable(t, c)
	var err error
	for i := range 4 {
		_, err = c.PutItem(t.Context(), &dynamodb.PutItemInput{TableName: aws.String("tbl"),
			Item: map[string]types.AttributeValue{"pk": s(fmt.Sprint(i)), "sk": s("x")}})
	}
	var te *types.ThrottlingException
	require.ErrorAs(t, err, &te)
	assert.Equal(t, "TableWriteAccountLimitExceeded", aws.ToString(te.ThrottlingReasons[0].Reason))
}

func TestServer_ConsumedCapacity(t *testing.T) {
	c, sim, _ := start(t, ddbsim.Config{})
	makeTable(t, c)
	out, err := c.PutItem(t.Context(), &dynamodb.PutItemInput{TableName: aws.String("tbl"), ReturnConsumedCapacity: types.ReturnConsumedCapacityIndexes,
		Item: map[string]types.AttributeValue{"pk": s("a"), "sk": s("1"), "g": s("G"), "gs": n(1)}})
	require.NoError(t, err)
	cc := out.ConsumedCapacity
	require.NotNil(t, cc)
	assert.Equal(t, 2.0, aws.ToFloat64(cc.CapacityUnits), "1 for the table, 1 for the index it enters")
	assert.Equal(t, 1.0, aws.ToFloat64(cc.Table.CapacityUnits))
	assert.Equal(t, 1.0, aws.ToFloat64(cc.GlobalSecondaryIndexes["by-g"].CapacityUnits))
	tx, err := c.TransactWriteItems(t.Context(), &dynamodb.TransactWriteItemsInput{ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
		TransactItems: []types.TransactWriteItem{{Put: &types.Put{TableName: aws.String("tbl"), Item: map[string]types.AttributeValue{"pk": s("b"), "sk": s("1")}}}}})
	require.NoError(t, err)
	require.Len(t, tx.ConsumedCapacity, 1)
	assert.Equal(t, 2.0, aws.ToFloat64(tx.ConsumedCapacity[0].CapacityUnits), "a transactional write costs twice")
	get, err := c.GetItem(t.Context(), &dynamodb.GetItemInput{TableName: aws.String("tbl"), ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
		Key: map[string]types.AttributeValue{"pk": s("b"), "sk": s("1")}})
	require.NoError(t, err)
	assert.Equal(t, 0.5, aws.ToFloat64(get.ConsumedCapacity.CapacityUnits), "an eventually consistent read costs half")
	st := sim.Stats()
	assert.Equal(t, 4.0, st.WriteUnits["tbl"])
	assert.Equal(t, 0.5, st.ReadUnits["tbl"])
}

func TestServer_StatsAndUnknownRequests(t *testing.T) {
	c, sim, url := start(t, ddbsim.Config{})
	makeTable(t, c)
	for i := range 3 {
		put(t, c, map[string]types.AttributeValue{"pk": s(fmt.Sprint(i)), "sk": s("x")})
	}
	post := func(target, body string) (int, map[string]any) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("X-Amz-Target", target)
		req.Header.Set("Content-Type", "application/x-amz-json-1.0")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]any
		b, _ := io.ReadAll(resp.Body)
		require.NoError(t, json.Unmarshal(b, &out), string(b))
		return resp.StatusCode, out
	}
	code, body := post("DynamoDB_20120810.ExecuteStatement", `{"Statement":"SELECT * FROM tbl"}`)
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Equal(t, "com.amazon.coral.service#UnknownOperationException", body["__type"])
	code, body = post("DynamoDB_20120810.GetItem", `{"TableName":"tbl","Key":{"pk":{"S":"0"},"sk":{"S":"x"}},"NoSuchParameter":1}`)
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Equal(t, "com.amazon.coral.validate#ValidationException", body["__type"])
	assert.Contains(t, body["message"], "NoSuchParameter", "an unknown parameter is refused, never ignored")

	st := sim.Stats()
	assert.True(t, st.Simulated)
	assert.Equal(t, int64(3), st.Operations["PutItem"].Requests)
	assert.Equal(t, int64(1), st.Operations["GetItem"].Errors)
	assert.Equal(t, int64(1), st.Operations["other"].Requests)
	resp, err := http.Get(url + "/ddbsim/stats")
	require.NoError(t, err)
	defer resp.Body.Close()
	var got ddbsim.Stats
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
	assert.Equal(t, st.Operations["PutItem"], got.Operations["PutItem"])
	assert.True(t, slices.Contains(ddbsim.Operations(), "TransactWriteItems"))
}

func TestServer_StartListensOnLoopbackOnly(t *testing.T) {
	_, err := ddbsim.New(ddbsim.Config{}).Start("0.0.0.0:0")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "loopback")
}

// TestServer_ConcurrentConditionalIncrements: many clients race on one
// counter with conditional updates; every success is counted once (moto's
// threaded server loses updates here).
func TestServer_ConcurrentConditionalIncrements(t *testing.T) {
	c, _, url := start(t, ddbsim.Config{PartitionWriteUnits: -1})
	makeTable(t, c)
	key := map[string]types.AttributeValue{"pk": s("counter"), "sk": s("x")}
	put(t, c, map[string]types.AttributeValue{"pk": s("counter"), "sk": s("x"), "v": n(0)})
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := ddbsim.Client(url, 1)
			for range 25 {
				got, err := cl.GetItem(t.Context(), &dynamodb.GetItemInput{TableName: aws.String("tbl"), Key: key, ConsistentRead: aws.Bool(true)})
				if !assert.NoError(t, err) {
					return
				}
				v := got.Item["v"].(*types.AttributeValueMemberN).Value
				_, err = cl.UpdateItem(t.Context(), &dynamodb.UpdateItemInput{TableName: aws.String("tbl"), Key: key,
					UpdateExpression: aws.String("SET v = v + :one"), ConditionExpression: aws.String("v = :seen"),
					ExpressionAttributeValues: map[string]types.AttributeValue{":one": n(1), ":seen": &types.AttributeValueMemberN{Value: v}}})
				var ccf *types.ConditionalCheckFailedException
				if errors.As(err, &ccf) {
					continue
				}
				if assert.NoError(t, err) {
					mu.Lock()
					wins++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	got, err := c.GetItem(t.Context(), &dynamodb.GetItemInput{TableName: aws.String("tbl"), Key: key, ConsistentRead: aws.Bool(true)})
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprint(wins), got.Item["v"].(*types.AttributeValueMemberN).Value)
	assert.Positive(t, wins)
}
