package dynamostore

import (
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/quarryhq/quarry/internal/awserr"
	"github.com/quarryhq/quarry/warmpool"
)

// Cancellation reason codes of TransactWriteItems (one per item).
const (
	reasonNone        = "None"
	reasonCondition   = "ConditionalCheckFailed"
	reasonConflict    = "TransactionConflict"
	reasonThrottled   = "ThrottlingError"
	reasonThroughput  = "ProvisionedThroughputExceeded"
	reasonLimit       = "RequestLimitExceeded"
	reasonServerError = "InternalServerError"
)

// translate turns an SDK error into the contract's terms, wrapped with
// action: throttling, server errors, timeouts and connection failures wrap
// warmpool.ErrUnavailable; a cancelled ctx stays context.Canceled.
// Conditional-check failures are decided by the caller (isConditionFailed,
// cancelReasons) before it gets here.
func translate(action string, err error) error {
	if err == nil {
		return nil
	}
	if isUnavailable(err) {
		return fmt.Errorf("%s: %w: %w", action, warmpool.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", action, err)
}

// isUnavailable reports whether err means the store could not be reached
// or refused the load: the caller may retry later.
func isUnavailable(err error) bool { return awserr.IsUnavailable(err) }

// isConditionFailed reports whether err is a failed condition of a single
// item write; old is the item as stored when the request asked for it
// (ReturnValuesOnConditionCheckFailure ALL_OLD), nil when there was none.
func isConditionFailed(err error) (old item, ok bool) {
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return ccf.Item, true
	}
	return nil, false
}

// isTableMissing reports whether err says a table does not exist.
func isTableMissing(err error) bool {
	var rnf *types.ResourceNotFoundException
	return errors.As(err, &rnf)
}

// cancelReasons returns the per-item reasons of a cancelled transaction;
// false when err is not one.
func cancelReasons(err error) ([]types.CancellationReason, bool) {
	var tce *types.TransactionCanceledException
	if !errors.As(err, &tce) {
		return nil, false
	}
	return tce.CancellationReasons, true
}

// reasonCode is the code of reason i ("" when DynamoDB gave none for it).
func reasonCode(reasons []types.CancellationReason, i int) string {
	if i >= len(reasons) || reasons[i].Code == nil {
		return ""
	}
	return *reasons[i].Code
}

// retryableReasons reports whether a cancelled transaction failed only for
// reasons that go away by themselves (a conflicting transaction in flight,
// throttling), and whether any of those was throttling.
func retryableReasons(reasons []types.CancellationReason) (retry, throttled bool) {
	if len(reasons) == 0 {
		return false, false
	}
	for i := range reasons {
		switch reasonCode(reasons, i) {
		case reasonNone, "":
		case reasonConflict:
			retry = true
		case reasonThrottled, reasonThroughput, reasonLimit, reasonServerError:
			retry, throttled = true, true
		default:
			return false, false
		}
	}
	return retry, throttled
}
