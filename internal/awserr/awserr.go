// Package awserr classifies AWS SDK errors for Quarry's AWS backends (the
// DynamoDB lease store, the DynamoDB relay broker, the ECS provider), so
// each translates them to its own contract's sentinels the same way.
//
// It must not import any other Quarry package.
package awserr

import (
	"context"
	"errors"
	"net"

	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// unavailableCodes are API error codes that mean "not now": throttling the
// SDK's retries did not outlast, and server-side failures.
var unavailableCodes = map[string]bool{
	"ProvisionedThroughputExceededException": true,
	"ThrottlingException":                    true,
	"Throttling":                             true,
	"RequestLimitExceeded":                   true,
	"InternalServerError":                    true,
	"InternalFailure":                        true,
	"ServiceUnavailable":                     true,
	"TransactionInProgressException":         true,
}

// IsUnavailable reports whether err means the service could not be reached
// or refused the load (throttling, a server fault, a timeout, a connection
// failure, the SDK's retry quota spent): the caller may retry later. A
// cancelled context is not unavailability.
func IsUnavailable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		if unavailableCodes[apiErr.ErrorCode()] {
			return true
		}
		if apiErr.ErrorFault() == smithy.FaultServer {
			return true
		}
	}
	var quota ratelimit.QuotaExceededError
	if errors.As(err, &quota) {
		return true
	}
	var sendErr *smithyhttp.RequestSendError
	if errors.As(err, &sendErr) {
		return true
	}
	var netErr net.Error
	return errors.As(err, &netErr)
}
