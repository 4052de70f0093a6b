package dynamostore

import (
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/quarryhq/quarry/internal/awserr"
	"github.com/quarryhq/quarry/warmpool"
)

// Cancellation reason codes of TransactWriteItems (one per item):
// internal/awserr's, which the checkpoint store reads too.
const (
	reasonNone      = awserr.ReasonNone
	reasonCondition = awserr.ReasonCondition
	reasonConflict  = awserr.ReasonConflict
	reasonThrottled = awserr.ReasonThrottled
)

// The readers of a cancelled transaction's reasons (internal/awserr).
var (
	cancelReasons    = awserr.CancelReasons
	reasonCode       = awserr.ReasonCode
	retryableReasons = awserr.RetryableReasons
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
