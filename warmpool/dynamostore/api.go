package dynamostore

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// API is the subset of *dynamodb.Client the store and the table functions
// call; *dynamodb.Client satisfies it. Tests of the pure parts need none of
// it; everything else runs against a real endpoint.
type API interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	PutItem(ctx context.Context, in *dynamodb.PutItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
	Query(ctx context.Context, in *dynamodb.QueryInput, optFns ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
	Scan(ctx context.Context, in *dynamodb.ScanInput, optFns ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error)
	BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, optFns ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	DeleteTable(ctx context.Context, in *dynamodb.DeleteTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DeleteTableOutput, error)
	UpdateTimeToLive(ctx context.Context, in *dynamodb.UpdateTimeToLiveInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error)
	DescribeTimeToLive(ctx context.Context, in *dynamodb.DescribeTimeToLiveInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DescribeTimeToLiveOutput, error)
}

var _ API = (*dynamodb.Client)(nil)

// Operation names counted by Store.Calls: the item and query calls the
// store makes (table management is not the store's).
const (
	opGetItem            = "GetItem"
	opPutItem            = "PutItem"
	opUpdateItem         = "UpdateItem"
	opDeleteItem         = "DeleteItem"
	opQuery              = "Query"
	opScan               = "Scan"
	opBatchGetItem       = "BatchGetItem"
	opTransactWriteItems = "TransactWriteItems"
)

// callCounter counts calls by operation. Its map is filled once by
// newCallCounter and only read afterwards, so it needs no lock.
type callCounter map[string]*atomic.Int64

func newCallCounter() callCounter {
	c := callCounter{}
	for _, op := range []string{opGetItem, opPutItem, opUpdateItem, opDeleteItem, opQuery, opScan, opBatchGetItem, opTransactWriteItems} {
		c[op] = new(atomic.Int64)
	}
	return c
}

func (c callCounter) snapshot() map[string]int64 {
	out := make(map[string]int64, len(c))
	for op, n := range c {
		out[op] = n.Load()
	}
	return out
}

// ddb is the store's view of the API: every call is counted, bounded by
// the call timeout, and its error translated (see translate).
type ddb struct {
	api     API
	calls   callCounter
	timeout time.Duration
}

// call runs one API call: counted, under the call timeout.
func call[In, Out any](ctx context.Context, d *ddb, op string, fn func(context.Context, In, ...func(*dynamodb.Options)) (Out, error), in In) (Out, error) {
	d.calls[op].Add(1)
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	return fn(ctx, in)
}

func (d *ddb) getItem(ctx context.Context, in *dynamodb.GetItemInput) (*dynamodb.GetItemOutput, error) {
	return call(ctx, d, opGetItem, d.api.GetItem, in)
}

func (d *ddb) putItem(ctx context.Context, in *dynamodb.PutItemInput) (*dynamodb.PutItemOutput, error) {
	return call(ctx, d, opPutItem, d.api.PutItem, in)
}

func (d *ddb) updateItem(ctx context.Context, in *dynamodb.UpdateItemInput) (*dynamodb.UpdateItemOutput, error) {
	return call(ctx, d, opUpdateItem, d.api.UpdateItem, in)
}

func (d *ddb) deleteItem(ctx context.Context, in *dynamodb.DeleteItemInput) (*dynamodb.DeleteItemOutput, error) {
	return call(ctx, d, opDeleteItem, d.api.DeleteItem, in)
}

func (d *ddb) query(ctx context.Context, in *dynamodb.QueryInput) (*dynamodb.QueryOutput, error) {
	return call(ctx, d, opQuery, d.api.Query, in)
}

func (d *ddb) scan(ctx context.Context, in *dynamodb.ScanInput) (*dynamodb.ScanOutput, error) {
	return call(ctx, d, opScan, d.api.Scan, in)
}

func (d *ddb) batchGet(ctx context.Context, in *dynamodb.BatchGetItemInput) (*dynamodb.BatchGetItemOutput, error) {
	return call(ctx, d, opBatchGetItem, d.api.BatchGetItem, in)
}

func (d *ddb) transact(ctx context.Context, in *dynamodb.TransactWriteItemsInput) (*dynamodb.TransactWriteItemsOutput, error) {
	return call(ctx, d, opTransactWriteItems, d.api.TransactWriteItems, in)
}
