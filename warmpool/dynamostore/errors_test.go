package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

func TestTranslate(t *testing.T) {
	tests := []struct {
		name        string
		err         error
		unavailable bool
		canceled    bool
	}{
		{name: "provisioned throughput", err: &types.ProvisionedThroughputExceededException{Message: aws.String("slow down")}, unavailable: true},
		{name: "request limit", err: &types.RequestLimitExceeded{Message: aws.String("limit")}, unavailable: true},
		{name: "throttling (generic code)", err: &smithy.GenericAPIError{Code: "ThrottlingException", Message: "rate"}, unavailable: true},
		{name: "internal server error", err: &types.InternalServerError{Message: aws.String("oops")}, unavailable: true},
		{name: "transaction in progress", err: &types.TransactionInProgressException{}, unavailable: true},
		{name: "server fault", err: &smithy.GenericAPIError{Code: "Whatever", Fault: smithy.FaultServer}, unavailable: true},
		{name: "retry quota spent", err: ratelimit.QuotaExceededError{Available: 0, Requested: 5}, unavailable: true},
		{name: "connection refused", err: &smithyhttp.RequestSendError{Err: &net.OpError{Op: "dial", Err: errors.New("connection refused")}}, unavailable: true},
		{name: "deadline", err: fmt.Errorf("call: %w", context.DeadlineExceeded), unavailable: true},
		{name: "canceled stays canceled", err: fmt.Errorf("call: %w", context.Canceled), canceled: true},
		{name: "validation is not retryable", err: &smithy.GenericAPIError{Code: "ValidationException", Fault: smithy.FaultClient}},
		{name: "missing table is not retryable", err: &types.ResourceNotFoundException{Message: aws.String("no table")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := translate("get lease", tc.err)
			require.Error(t, got)
			assert.Contains(t, got.Error(), "get lease: ")
			assert.Equal(t, tc.unavailable, errors.Is(got, warmpool.ErrUnavailable))
			assert.Equal(t, tc.canceled, errors.Is(got, context.Canceled))
			assert.ErrorIs(t, got, tc.err, "the SDK error stays in the chain")
		})
	}
	assert.NoError(t, translate("x", nil))
}

func TestCancelReasons(t *testing.T) {
	code := func(c string) types.CancellationReason { return types.CancellationReason{Code: aws.String(c)} }
	tce := &types.TransactionCanceledException{CancellationReasons: []types.CancellationReason{
		code(reasonNone), code(reasonCondition), {Code: aws.String(reasonCondition), Item: item{fLeaseID: avS("sbx-1")}},
	}}
	reasons, ok := cancelReasons(fmt.Errorf("claim: %w", tce))
	require.True(t, ok)
	assert.Equal(t, reasonNone, reasonCode(reasons, 0))
	assert.Equal(t, reasonCondition, reasonCode(reasons, 1))
	assert.Equal(t, "", reasonCode(reasons, 7), "no reason for an item beyond the list")
	_, ok = cancelReasons(errors.New("other"))
	assert.False(t, ok)

	tests := []struct {
		name             string
		reasons          []types.CancellationReason
		retry, throttled bool
	}{
		{name: "conflict", reasons: []types.CancellationReason{code(reasonNone), code(reasonConflict)}, retry: true},
		{name: "throttled", reasons: []types.CancellationReason{code(reasonThrottled), code(reasonNone)}, retry: true, throttled: true},
		{name: "condition is not retried blindly", reasons: []types.CancellationReason{code(reasonCondition), code(reasonConflict)}},
		{name: "validation", reasons: []types.CancellationReason{code("ValidationError")}},
		{name: "no reasons", reasons: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			retry, throttled := retryableReasons(tc.reasons)
			assert.Equal(t, tc.retry, retry)
			assert.Equal(t, tc.throttled, throttled)
		})
	}
}

func TestIsConditionFailed(t *testing.T) {
	old, ok := isConditionFailed(fmt.Errorf("x: %w", &types.ConditionalCheckFailedException{Item: item{fVersion: avN(3)}}))
	require.True(t, ok)
	assert.Equal(t, avN(3), old[fVersion])
	_, ok = isConditionFailed(&types.InternalServerError{})
	assert.False(t, ok)
}

// TestStore_UnreachableEndpointIsUnavailable uses a real SDK client against
// a port nothing listens on: every store call fails with ErrUnavailable,
// promptly.
func TestStore_UnreachableEndpointIsUnavailable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // now nothing listens there
	client := dynamodb.New(dynamodb.Options{
		Region: "us-east-1", BaseEndpoint: aws.String("http://" + addr), RetryMaxAttempts: 1,
		Credentials: aws.AnonymousCredentials{},
	})
	s, err := New(client, Config{})
	require.NoError(t, err)
	_, err = s.GetLease(t.Context(), "sbx-1")
	assert.ErrorIs(t, err, warmpool.ErrUnavailable)
	_, err = s.Claim(t.Context(), warmpool.ClaimRequest{Pool: "p", Now: t0, Lease: warmpool.Lease{ID: "sbx-1", Owner: "o"}})
	assert.ErrorIs(t, err, warmpool.ErrUnavailable)
	err = s.ReserveTasks(t.Context(), "p", 10, []warmpool.TaskRecord{{ID: "tsk-1"}})
	assert.ErrorIs(t, err, warmpool.ErrUnavailable)
	assert.Equal(t, int64(1), s.Calls()[opGetItem], "calls are counted, failed ones too")
}

func TestStore_ClosedAndCanceled(t *testing.T) {
	client := dynamodb.New(dynamodb.Options{Region: "us-east-1", BaseEndpoint: aws.String("http://127.0.0.1:1"), Credentials: aws.AnonymousCredentials{}})
	s, err := New(client, Config{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = s.ListTasks(ctx, "p")
	assert.ErrorIs(t, err, context.Canceled)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "closing twice is fine")
	_, err = s.GetLease(t.Context(), "sbx-1")
	assert.ErrorIs(t, err, warmpool.ErrClosed)
	assert.Zero(t, s.Calls()[opGetItem], "nothing was sent")
}
