package s3store

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/checkpoints/checkpointtest"
	"github.com/quarryhq/quarry/internal/awserr"
)

// hookedDynamo is the emulator's DynamoDB with TransactWriteItems in the
// hands of a test: transact gets the call's number (from 1) and the real
// call.
type hookedDynamo struct {
	DynamoAPI
	calls    atomic.Int32
	transact func(n int32, real func() (*dynamodb.TransactWriteItemsOutput, error)) (*dynamodb.TransactWriteItemsOutput, error)
}

func (h *hookedDynamo) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, optFns ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	return h.transact(h.calls.Add(1), func() (*dynamodb.TransactWriteItemsOutput, error) {
		return h.DynamoAPI.TransactWriteItems(ctx, in, optFns...)
	})
}

func cancelled(codes ...string) error {
	reasons := make([]types.CancellationReason, len(codes))
	for i, c := range codes {
		reasons[i] = types.CancellationReason{Code: aws.String(c)}
	}
	return &types.TransactionCanceledException{Message: aws.String("cancelled"), CancellationReasons: reasons}
}

// errLost stands for an answer that never came (a connection reset).
var errLost = errors.New("read tcp: connection reset by peer")

// A Put's commit, its answer or its transaction gone wrong in each way
// DynamoDB can: what the Put returns, what is kept, and what is counted.
func TestPut_CommitOutcomes(t *testing.T) {
	f := newFixture(t)
	start := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	data := bytes.Repeat([]byte("archive "), 1000)
	for _, tc := range []struct {
		name     string
		transact func(n int32, real func() (*dynamodb.TransactWriteItemsOutput, error)) (*dynamodb.TransactWriteItemsOutput, error)
		kept     bool
		err      error
		calls    int32
	}{
		{name: "a conflicting transaction is retried", kept: true, calls: 3,
			transact: func(n int32, real func() (*dynamodb.TransactWriteItemsOutput, error)) (*dynamodb.TransactWriteItemsOutput, error) {
				if n < 3 {
					return nil, cancelled(awserr.ReasonNone, awserr.ReasonNone, awserr.ReasonConflict)
				}
				return real()
			}},
		{name: "a commit whose answer was lost is read back", kept: true, calls: 1,
			transact: func(n int32, real func() (*dynamodb.TransactWriteItemsOutput, error)) (*dynamodb.TransactWriteItemsOutput, error) {
				if _, err := real(); err != nil {
					return nil, err
				}
				return nil, errLost
			}},
		{name: "a commit that did not happen keeps nothing", err: errLost, calls: 1,
			transact: func(int32, func() (*dynamodb.TransactWriteItemsOutput, error)) (*dynamodb.TransactWriteItemsOutput, error) {
				return nil, errLost
			}},
		{name: "conflicts that never pass are unavailable", err: checkpoints.ErrUnavailable, calls: transactTries,
			transact: func(int32, func() (*dynamodb.TransactWriteItemsOutput, error)) (*dynamodb.TransactWriteItemsOutput, error) {
				return nil, cancelled(awserr.ReasonNone, awserr.ReasonConflict, awserr.ReasonNone)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hook := &hookedDynamo{DynamoAPI: f.ddb, transact: tc.transact}
			h := f.storeOn(t, checkpointtest.NewClock(start), Config{Budget: checkpoints.Budget{PerOwner: 1 << 20}}, hook)
			ctx := context.Background()
			m, err := h.Put(ctx, meta(start), bytes.NewReader(data), 1<<20)
			assert.Equal(t, tc.calls, hook.calls.Load(), "transactions tried")
			blobs, berr := h.Blobs(ctx)
			require.NoError(t, berr)
			u, uerr := h.Usage(ctx, m.Owner)
			require.NoError(t, uerr)
			if !tc.kept {
				require.ErrorIs(t, err, tc.err)
				assert.Zero(t, blobs, "no object is left")
				assert.Equal(t, checkpoints.Usage{}, u, "nothing is counted")
				return
			}
			require.NoError(t, err)
			rc, _, err := h.Open(ctx, m.ID, m.Owner)
			require.NoError(t, err)
			got, err := io.ReadAll(rc)
			require.NoError(t, rc.Close())
			require.NoError(t, err, "the archive reads back whole")
			assert.Equal(t, data, got)
			assert.Equal(t, 1, blobs)
			assert.Equal(t, checkpoints.Usage{Owner: int64(len(data)), Total: int64(len(data))}, u, "counted once")
		})
	}
}

// Checkpoints made before the budget (no counted attribute) count nothing,
// and their removal frees nothing: the counters never go below zero.
func TestDelete_UncountedCheckpointFreesNothing(t *testing.T) {
	f := newFixture(t)
	start := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	h := f.store(t, checkpointtest.NewClock(start), Config{})
	ctx := context.Background()
	old, err := h.Put(ctx, meta(start), bytes.NewReader([]byte("made before the budget")), 1<<20)
	require.NoError(t, err)
	_, err = f.ddb.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(h.cfg.Table), Key: key(old.ID),
		UpdateExpression: aws.String("REMOVE #c"), ExpressionAttributeNames: map[string]string{"#c": attrCounted}})
	require.NoError(t, err)
	for _, pk := range []string{usagePK(old.Owner), usageTotalPK} { // as if it was never counted
		_, err = f.ddb.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(h.cfg.Table), Key: key(pk),
			UpdateExpression: aws.String("SET #b = :z"), ExpressionAttributeNames: map[string]string{"#b": attrBytes},
			ExpressionAttributeValues: map[string]types.AttributeValue{":z": num(0)}})
		require.NoError(t, err)
	}
	now, err := h.Put(ctx, meta(start), bytes.NewReader([]byte("made after")), 1<<20)
	require.NoError(t, err)

	require.NoError(t, h.Delete(ctx, old.ID, old.Owner))
	u, err := h.Usage(ctx, old.Owner)
	require.NoError(t, err)
	assert.Equal(t, checkpoints.Usage{Owner: now.SizeBytes, Total: now.SizeBytes}, u)
}
