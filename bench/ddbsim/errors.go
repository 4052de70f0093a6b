package ddbsim

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// Error codes the simulator answers with, as DynamoDB names them.
const (
	codeValidation         = "ValidationException"
	codeConditionFailed    = "ConditionalCheckFailedException"
	codeResourceNotFound   = "ResourceNotFoundException"
	codeResourceInUse      = "ResourceInUseException"
	codeTxnCanceled        = "TransactionCanceledException"
	codeIdempotentMismatch = "IdempotentParameterMismatchException"
	codeThroughput         = "ProvisionedThroughputExceededException"
	codeThrottling         = "ThrottlingException"
	codeUnknownOperation   = "UnknownOperationException"
	codeSerialization      = "SerializationException"
	codeInternal           = "InternalServerError"
)

// Messages DynamoDB sends with its throttling errors.
const (
	msgKeyRangeThrottled = "Throughput exceeds the current capacity of your table or index. DynamoDB is automatically scaling your table or index so please try again shortly. If exceptions persist, check if you have a hot key: https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/bp-partition-key-design.html"
	msgTableThrottled    = "Throughput exceeds the amount of throughput allowed for the table or index (simulated quota)"
	msgConditionFailed   = "The conditional request failed"
)

// apiError is one error answer: its code, message and the members some
// errors carry.
type apiError struct {
	code    string
	message string
	status  int
	// item is the stored item of a failed condition (ALL_OLD).
	item Item
	// reasons are a cancelled transaction's, one per action.
	reasons []cancelReason
	// throttling names why a request was throttled.
	throttling []throttlingReason
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

// cancelReason is one action's entry in CancellationReasons.
type cancelReason struct {
	Code    string `json:"Code"`
	Message string `json:"Message,omitempty"`
	Item    Item   `json:"Item,omitempty"`
}

// throttlingReason is one entry of ThrottlingReasons.
type throttlingReason struct {
	Reason   string `json:"reason"`
	Resource string `json:"resource"`
}

// Cancellation reason codes, as DynamoDB reports them per action.
const (
	reasonNone       = "None"
	reasonCondition  = "ConditionalCheckFailed"
	reasonValidation = "ValidationError"
	reasonThrottled  = "ThrottlingError"
)

func newError(code string, status int, format string, args ...any) *apiError {
	msg := format
	if len(args) > 0 {
		msg = fmt.Sprintf(format, args...)
	}
	return &apiError{code: code, message: msg, status: status}
}

// validation is a ValidationException with DynamoDB's message text.
func validation(format string, args ...any) *apiError {
	return newError(codeValidation, http.StatusBadRequest, format, args...)
}

func notFound(format string, args ...any) *apiError {
	return newError(codeResourceNotFound, http.StatusBadRequest, format, args...)
}

func conditionFailed(old Item) *apiError {
	e := newError(codeConditionFailed, http.StatusBadRequest, msgConditionFailed)
	e.item = old
	return e
}

// body renders e in DynamoDB's JSON error shape. Most errors name their
// message "message"; a few (transactions, idempotency) "Message".
func (e *apiError) body() []byte {
	prefix := "com.amazonaws.dynamodb.v20120810#"
	switch e.code {
	case codeValidation:
		prefix = "com.amazon.coral.validate#"
	case codeUnknownOperation, codeSerialization:
		prefix = "com.amazon.coral.service#"
	}
	out := map[string]any{"__type": prefix + e.code}
	switch e.code {
	case codeTxnCanceled, codeIdempotentMismatch:
		out["Message"] = e.message
	default:
		out["message"] = e.message
	}
	if len(e.item) > 0 {
		out["Item"] = e.item
	}
	if e.reasons != nil {
		out["CancellationReasons"] = e.reasons
	}
	if len(e.throttling) > 0 {
		if e.code == codeThrottling {
			out["throttlingReasons"] = e.throttling
		} else {
			out["ThrottlingReasons"] = e.throttling
		}
	}
	b, err := json.Marshal(out)
	if err != nil { // a Value always marshals; keep the answer well-formed anyway
		return []byte(`{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"encode error"}`)
	}
	return b
}
