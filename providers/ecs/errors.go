package ecs

import (
	"errors"
	"strings"

	"github.com/aws/smithy-go"

	"github.com/quarryhq/quarry/internal/awserr"
)

// Classifiers of ECS's errors, used at the edge to translate them.

// apiError returns err's API error code and message, or "" when it has none.
func apiError(err error) (code, msg string) {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode(), ae.ErrorMessage()
	}
	return "", ""
}

// isThrottled: ECS asked us to slow down. Besides the usual throttling codes,
// RunTask reports its launch-rate limit as InvalidParameterException (or
// ClientException) with the message "Rate exceeded", and
// RegisterTaskDefinition two registrations of one family at once (two
// replicas) as ClientException "Too many concurrent attempts to create a
// new revision of the specified family".
func isThrottled(err error) bool {
	code, msg := apiError(err)
	switch code {
	case "ThrottlingException", "Throttling", "TooManyRequestsException", "RequestLimitExceeded":
		return true
	case "InvalidParameterException", "ClientException":
		msg = strings.ToLower(msg)
		return strings.Contains(msg, "rate exceeded") || strings.Contains(msg, "too many concurrent attempts")
	}
	return false
}

// isInactive: the task definition is INACTIVE already (a second
// DeregisterTaskDefinition).
func isInactive(err error) bool {
	code, msg := apiError(err)
	return (code == "ClientException" || code == "InvalidParameterException") && strings.Contains(strings.ToLower(msg), "inactive")
}

// isNotFound: the task or task definition does not exist.
func isNotFound(err error) bool {
	code, msg := apiError(err)
	if code != "InvalidParameterException" && code != "ClientException" {
		return false
	}
	msg = strings.ToLower(msg)
	return strings.Contains(msg, "not found") || strings.Contains(msg, "unable to describe task definition") ||
		strings.Contains(msg, "does not exist")
}

// isInvalid: ECS refused the request's parameters (a bad image, role,
// subnet or size), which no retry fixes.
func isInvalid(err error) bool {
	if isThrottled(err) {
		return false
	}
	code, _ := apiError(err)
	switch code {
	case "InvalidParameterException", "ClientException", "PlatformUnknownException",
		"PlatformTaskDefinitionIncompatibilityException", "AccessDeniedException", "ClusterNotFoundException":
		return true
	}
	return false
}

// isRetryable: a throttle or a transient failure worth another try.
func isRetryable(err error) bool { return isThrottled(err) || awserr.IsUnavailable(err) }
