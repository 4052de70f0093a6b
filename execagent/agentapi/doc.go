// Package agentapi is the wire protocol of the exec agent: routes, request
// and response types, error codes, the agent's token derivation, and a
// small Go client. The agent (package execagent), the warm pool (health
// checks, init), the providers (the agent's token; their conformance
// suite's health checks) and the gateway (proxying) all speak it through
// this package.
//
// Its error codes and error body are api's (the gateway passes the agent's
// errors on to its own callers), so that each code is declared once.
//
// This package must not import any other Quarry package but api.
package agentapi
