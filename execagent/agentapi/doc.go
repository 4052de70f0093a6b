// Package agentapi is the wire protocol of the exec agent: routes, request
// and response types, error codes, and a small Go client. The agent
// (package execagent), the providers (health checks) and the gateway (init,
// proxying) all speak it through this package.
//
// This package must not import any other Quarry package.
package agentapi
