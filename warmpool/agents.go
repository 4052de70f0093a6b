package warmpool

import (
	"context"
	"net/http"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// Agents reaches the exec agents of tasks: their health check and their
// per-lease init. Implementations must be safe for concurrent use and must
// honour ctx (the manager bounds every call with a timeout).
type Agents interface {
	// Health calls GET /healthz on the agent at url with token.
	Health(ctx context.Context, url, token string) (agentapi.Health, error)
	// Init calls POST /v1/init on the agent at url with token.
	Init(ctx context.Context, url, token string, req agentapi.InitRequest) (agentapi.Health, error)
}

// HTTPAgents implements Agents with agentapi.Client over one shared
// *http.Client.
type HTTPAgents struct {
	client *http.Client
}

var _ Agents = (*HTTPAgents)(nil)

// NewHTTPAgents returns Agents that call agents with httpClient (nil means
// http.DefaultClient; pass one with timeouts and a pooled transport).
func NewHTTPAgents(httpClient *http.Client) *HTTPAgents {
	if httpClient == nil {
		httpClient = http.DefaultClient
	}
	return &HTTPAgents{client: httpClient}
}

// Health calls GET /healthz. A non-2xx answer is an *agentapi.Error.
func (a *HTTPAgents) Health(ctx context.Context, url, token string) (agentapi.Health, error) {
	return agentapi.New(url, token, a.client).Health(ctx)
}

// Init calls POST /v1/init. A non-2xx answer is an *agentapi.Error.
func (a *HTTPAgents) Init(ctx context.Context, url, token string, req agentapi.InitRequest) (agentapi.Health, error) {
	return agentapi.New(url, token, a.client).Init(ctx, req)
}
