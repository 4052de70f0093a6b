package awserr

import (
	"errors"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Cancellation reason codes of DynamoDB's TransactWriteItems (one per
// item, in the order of the transaction's items).
const (
	ReasonNone        = "None"
	ReasonCondition   = "ConditionalCheckFailed"
	ReasonConflict    = "TransactionConflict"
	ReasonThrottled   = "ThrottlingError"
	ReasonThroughput  = "ProvisionedThroughputExceeded"
	ReasonLimit       = "RequestLimitExceeded"
	ReasonServerError = "InternalServerError"
)

// CancelReasons returns the per-item reasons of a cancelled transaction;
// false when err is not one.
func CancelReasons(err error) ([]types.CancellationReason, bool) {
	var tce *types.TransactionCanceledException
	if !errors.As(err, &tce) {
		return nil, false
	}
	return tce.CancellationReasons, true
}

// ReasonCode is the code of reason i ("" when DynamoDB gave none for it).
func ReasonCode(reasons []types.CancellationReason, i int) string {
	if i >= len(reasons) || reasons[i].Code == nil {
		return ""
	}
	return *reasons[i].Code
}

// RetryableReasons reports whether a cancelled transaction failed only for
// reasons that go away by themselves (a conflicting transaction in flight,
// throttling), and whether any of those was throttling.
func RetryableReasons(reasons []types.CancellationReason) (retry, throttled bool) {
	if len(reasons) == 0 {
		return false, false
	}
	for i := range reasons {
		switch ReasonCode(reasons, i) {
		case ReasonNone, "":
		case ReasonConflict:
			retry = true
		case ReasonThrottled, ReasonThroughput, ReasonLimit, ReasonServerError:
			retry, throttled = true, true
		default:
			return false, false
		}
	}
	return retry, throttled
}
