package errclass

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

// AgentMayBeDown reports whether err, from a call to a sandbox's agent,
// suggests that the task itself may be gone (so its lease should be
// checked), as opposed to the gateway's own limits or the agent's answer.
func AgentMayBeDown(err error) bool {
	var ce *agentapi.CallError
	return errors.As(err, &ce) && !errors.Is(ce.Err, agentapi.ErrCallLimit) && !errors.Is(ce.Err, agentapi.ErrAnswerTooLarge)
}

// ofAgentCall classifies a call to the agent that got no usable answer.
func ofAgentCall(subject string, ce *agentapi.CallError) Class {
	var ne net.Error
	switch {
	case errors.Is(ce.Err, agentapi.ErrCallLimit):
		return Class{Code: api.CodeUnavailable, Status: http.StatusServiceUnavailable, Retryable: true,
			Message: "too many concurrent calls to the agent of " + subject + "; retry later"}
	case errors.Is(ce.Err, agentapi.ErrAnswerTooLarge):
		return Class{Code: api.CodeAgentUnreachable, Status: http.StatusBadGateway,
			Message: "the agent of " + subject + " answered with a body over the gateway's limit (QUARRY_MAX_AGENT_RESPONSE)"}
	case errors.Is(ce.Err, os.ErrDeadlineExceeded), errors.Is(ce.Err, context.DeadlineExceeded),
		errors.As(ce.Err, &ne) && ne.Timeout():
		return Class{Code: api.CodeTimeout, Status: http.StatusGatewayTimeout,
			Message: "the agent of " + subject + " did not answer in time"}
	default:
		return Class{Code: api.CodeAgentUnreachable, Status: http.StatusBadGateway,
			Message: "the agent of " + subject + " is unreachable: " + ce.Err.Error()}
	}
}
