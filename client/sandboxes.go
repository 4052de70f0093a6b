package client

import (
	"context"
	"net/http"
	"net/url"
	"sort"

	"github.com/quarryhq/quarry/api"
)

// Sandbox states (Sandbox.State).
const (
	StateActive   = api.StateActive
	StateReleased = api.StateReleased
	StateExpired  = api.StateExpired
	StateLost     = api.StateLost
)

// The gateway's wire types, declared once in package api and named here
// for the client's callers.
type (
	// Sandbox is a lease on one sandbox, as the gateway reports it.
	Sandbox = api.Sandbox
	// CreateSandboxRequest asks for a sandbox from a pool; its
	// IdempotencyKey is sent as the Idempotency-Key header.
	CreateSandboxRequest = api.CreateSandboxRequest
	// Pool is one warm pool: its configuration and its current counts.
	Pool = api.Pool
)

// ListSandboxesRequest filters ListSandboxes; empty fields do not filter.
type ListSandboxesRequest struct {
	Pool   string
	State  string
	Labels map[string]string // every label must match
}

// CreateSandbox leases a sandbox (POST /v1/sandboxes). With an
// IdempotencyKey, retrying is safe: the gateway returns the same sandbox.
// A pool at max_total fails with a 503 for which IsNoCapacity is true.
func (c *Client) CreateSandbox(ctx context.Context, req CreateSandboxRequest) (Sandbox, error) {
	cl := call{method: http.MethodPost, route: route{path: "/v1/sandboxes"}, in: req}
	if req.IdempotencyKey != "" {
		cl.header = http.Header{"Idempotency-Key": {req.IdempotencyKey}}
	}
	var sb Sandbox
	err := c.do(ctx, cl, &sb)
	return sb, err
}

// GetSandbox returns a sandbox of the caller (GET /v1/sandboxes/{id}); ended
// ones stay visible for the gateway's retention period.
func (c *Client) GetSandbox(ctx context.Context, id string) (Sandbox, error) {
	var sb Sandbox
	err := c.do(ctx, call{method: http.MethodGet, route: sandboxRoute(id)}, &sb)
	return sb, err
}

// ListSandboxes returns the caller's sandboxes that match req (GET /v1/sandboxes).
func (c *Client) ListSandboxes(ctx context.Context, req ListSandboxesRequest) ([]Sandbox, error) {
	q := url.Values{}
	if req.Pool != "" {
		q.Set("pool", req.Pool)
	}
	if req.State != "" {
		q.Set("state", req.State)
	}
	addLabels(q, req.Labels)
	var out api.SandboxList
	err := c.do(ctx, call{method: http.MethodGet, route: route{path: "/v1/sandboxes"}, query: q}, &out)
	return out.Sandboxes, err
}

// addLabels adds one label=k=v to q per label, in key order.
func addLabels(q url.Values, labels map[string]string) {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		q.Add("label", k+"="+labels[k])
	}
}

// Heartbeat renews a sandbox's lease and returns it with the new ExpiresAt.
// An ended lease fails with a 410 for which IsGone is true.
func (c *Client) Heartbeat(ctx context.Context, id string) (Sandbox, error) {
	var sb Sandbox
	err := c.do(ctx, call{method: http.MethodPost, route: sandboxRoute(id, "heartbeat")}, &sb)
	return sb, err
}

// DeleteSandbox releases a sandbox (DELETE /v1/sandboxes/{id}) and returns it
// in state released; the sandbox is stopped, never reused.
func (c *Client) DeleteSandbox(ctx context.Context, id string) (Sandbox, error) {
	var sb Sandbox
	err := c.do(ctx, call{method: http.MethodDelete, route: sandboxRoute(id)}, &sb)
	return sb, err
}

// Pools returns every pool with its counts (GET /v1/pools).
func (c *Client) Pools(ctx context.Context) ([]Pool, error) {
	var out api.PoolList
	err := c.do(ctx, call{method: http.MethodGet, route: route{path: "/v1/pools"}}, &out)
	return out.Pools, err
}
