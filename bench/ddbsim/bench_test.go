package ddbsim_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/valyala/fasthttp"

	"github.com/quarryhq/quarry/bench/ddbsim"
	"github.com/quarryhq/quarry/bench/ddbsim/ddbsimtest"
)

// benchItems is how many items the benchmarks' table holds.
const benchItems = 10000

// BenchmarkServer measures the simulator's throughput (simulated
// DynamoDB: these are the simulator's numbers, not AWS's) with 64
// concurrent clients on keep-alive connections. "raw" clients (fasthttp)
// post prebuilt bodies, so the server's cost dominates; "sdk" goes through the
// AWS SDK, as the store does (its signing and middleware cost the client's
// share of the same two cores). Limits are off: this measures speed, not
// throttling. Reported: req/s.
func BenchmarkServer(b *testing.B) {
	url, _ := ddbsimtest.Start(b, ddbsim.Config{IndexLag: -1, PartitionReadUnits: -1, PartitionWriteUnits: -1, TableReadUnits: -1, TableWriteUnits: -1})
	c := ddbsim.Client(url, 1)
	makeBenchTable(b, c)
	hc := &fasthttp.HostClient{Addr: strings.TrimPrefix(url, "http://"), MaxConns: 256}
	key := func(i int) string { return fmt.Sprintf(`{"pk":{"S":"task#%06d"}}`, i) }
	raw := map[string]func(i int) (string, string){
		"GetItem": func(i int) (string, string) {
			return "GetItem", `{"TableName":"bench","ConsistentRead":true,"Key":` + key(i) + `}`
		},
		"PutItem": func(i int) (string, string) {
			return "PutItem", fmt.Sprintf(`{"TableName":"bench","Item":{"pk":{"S":"task#%06d"},"state":{"S":"ready"},"v":{"N":"1"},"pool_pk":{"S":"p#%d"},"url":{"S":"http://127.0.0.1:1"}}}`, i, i%8)
		},
		"UpdateItem": func(i int) (string, string) {
			return "UpdateItem", `{"TableName":"bench","Key":` + key(i) + `,"UpdateExpression":"SET #s = :s ADD #v :one","ConditionExpression":"attribute_exists(pk)",` +
				`"ExpressionAttributeNames":{"#s":"state","#v":"v"},"ExpressionAttributeValues":{":s":{"S":"leased"},":one":{"N":"1"}}}`
		},
		"Query": func(i int) (string, string) {
			return "Query", fmt.Sprintf(`{"TableName":"bench","IndexName":"by-pool","Limit":4,"KeyConditionExpression":"pool_pk = :p",`+
				`"ExpressionAttributeValues":{":p":{"S":"p#%d"}}}`, i%8)
		},
		"TransactWriteItems": func(i int) (string, string) {
			return "TransactWriteItems", fmt.Sprintf(`{"TransactItems":[`+
				`{"Update":{"TableName":"bench","Key":{"pk":{"S":"task#%06d"}},"UpdateExpression":"ADD v :one","ExpressionAttributeValues":{":one":{"N":"1"}}}},`+
				`{"Put":{"TableName":"bench","Item":{"pk":{"S":"lease#%d"},"owner":{"S":"o"}},"ConditionExpression":"attribute_not_exists(pk)"}}]}`,
				i%benchItems, rand.Int64())
		},
	}
	for _, op := range []string{"GetItem", "PutItem", "UpdateItem", "Query", "TransactWriteItems"} {
		b.Run("raw/"+op, func(b *testing.B) {
			var fails atomic.Int64
			b.SetParallelism(32) // 64 clients on 2 cores
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					name, body := raw[op](rand.IntN(benchItems))
					req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
					req.SetRequestURI(url + "/")
					req.Header.SetMethod(fasthttp.MethodPost)
					req.Header.Set("X-Amz-Target", "DynamoDB_20120810."+name)
					req.Header.SetContentType("application/x-amz-json-1.0")
					req.SetBodyString(body)
					if err := hc.Do(req, resp); err != nil || resp.StatusCode() != fasthttp.StatusOK {
						fails.Add(1)
					}
					fasthttp.ReleaseRequest(req)
					fasthttp.ReleaseResponse(resp)
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
			if f := fails.Load(); f > 0 {
				b.Fatalf("%d of %d requests failed", f, b.N)
			}
		})
	}
	b.Run("sdk/GetItem", func(b *testing.B) {
		b.SetParallelism(32)
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_, err := c.GetItem(b.Context(), &dynamodb.GetItemInput{TableName: aws.String("bench"), ConsistentRead: aws.Bool(true),
					Key: map[string]types.AttributeValue{"pk": s(fmt.Sprintf("task#%06d", rand.IntN(benchItems)))}})
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
	})
}

// makeBenchTable creates "bench" (pk S; index by-pool on pool_pk, KEYS_ONLY)
// with benchItems items over 8 pools.
func makeBenchTable(b *testing.B, c *dynamodb.Client) {
	b.Helper()
	_, err := c.CreateTable(b.Context(), &dynamodb.CreateTableInput{
		TableName: aws.String("bench"), BillingMode: types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String("pk"), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String("pool_pk"), AttributeType: types.ScalarAttributeTypeS},
		},
		KeySchema: []types.KeySchemaElement{{AttributeName: aws.String("pk"), KeyType: types.KeyTypeHash}},
		GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{{IndexName: aws.String("by-pool"),
			KeySchema:  []types.KeySchemaElement{{AttributeName: aws.String("pool_pk"), KeyType: types.KeyTypeHash}},
			Projection: &types.Projection{ProjectionType: types.ProjectionTypeKeysOnly}}},
	})
	if err != nil {
		b.Fatal(err)
	}
	for start := 0; start < benchItems; start += 25 {
		var reqs []types.WriteRequest
		for i := start; i < start+25; i++ {
			reqs = append(reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: map[string]types.AttributeValue{
				"pk": s(fmt.Sprintf("task#%06d", i)), "state": s("ready"), "v": n(1), "pool_pk": s(fmt.Sprintf("p#%d", i%8)),
				"url": s("http://127.0.0.1:1")}}})
		}
		if _, err := c.BatchWriteItem(b.Context(), &dynamodb.BatchWriteItemInput{RequestItems: map[string][]types.WriteRequest{"bench": reqs}}); err != nil {
			b.Fatal(err)
		}
	}
}
