package errclass

import (
	"context"
	"errors"
	"net"
	"net/http"

	"github.com/valyala/fasthttp"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

// This file is the only one that imports fasthttp. The gateway calls the
// agents with fasthttp, and a failed call is an *agentapi.CallError that
// carries fasthttp's error as it came; the surfaces classify it as they get
// it (rockcompat, the gateway's WebSocket close), so there is no one edge
// to translate it at yet. Once the gateway's proxy translates fasthttp's
// errors where it makes the CallError, this file knows none.

// AgentMayBeDown reports whether err, from a call to a sandbox's agent,
// suggests that the task itself may be gone (so its lease should be
// checked), as opposed to the gateway's own limits or the agent's answer.
func AgentMayBeDown(err error) bool {
	var ce *agentapi.CallError
	return errors.As(err, &ce) && !errors.Is(ce.Err, fasthttp.ErrNoFreeConns) && !errors.Is(ce.Err, fasthttp.ErrBodyTooLarge)
}

// ofAgentCall classifies a call to the agent that got no usable answer.
func ofAgentCall(subject string, ce *agentapi.CallError) Class {
	var ne net.Error
	switch {
	case errors.Is(ce.Err, fasthttp.ErrNoFreeConns):
		return Class{Code: api.CodeUnavailable, Status: http.StatusServiceUnavailable, Retryable: true,
			Message: "too many concurrent calls to the agent of " + subject + "; retry later"}
	case errors.Is(ce.Err, fasthttp.ErrBodyTooLarge):
		return Class{Code: api.CodeAgentUnreachable, Status: http.StatusBadGateway,
			Message: "the agent of " + subject + " answered with a body over the gateway's limit (QUARRY_MAX_AGENT_RESPONSE)"}
	case errors.Is(ce.Err, fasthttp.ErrTimeout), errors.Is(ce.Err, fasthttp.ErrDialTimeout),
		errors.Is(ce.Err, context.DeadlineExceeded), errors.As(ce.Err, &ne) && ne.Timeout():
		return Class{Code: api.CodeTimeout, Status: http.StatusGatewayTimeout,
			Message: "the agent of " + subject + " did not answer in time"}
	default:
		return Class{Code: api.CodeAgentUnreachable, Status: http.StatusBadGateway,
			Message: "the agent of " + subject + " is unreachable: " + ce.Err.Error()}
	}
}
