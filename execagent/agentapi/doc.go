// Package agentapi is the wire protocol of the exec agent: routes, request
// and response types, error codes, and a small Go client. The agent
// (package execagent), the providers (health checks) and the gateway (init,
// proxying) all speak it through this package.
//
// Its error codes and error body are api's (the gateway passes the agent's
// errors on to its own callers), so that each code is declared once.
//
// This package must not import any other Quarry package but api.
package agentapi
