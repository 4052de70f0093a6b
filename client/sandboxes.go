package client

import (
	"context"
	"net/http"
	"net/url"
	"sort"
	"time"
)

// Sandbox states (Sandbox.State).
const (
	StateActive   = "active"
	StateReleased = "released"
	StateExpired  = "expired"
	StateLost     = "lost"
)

// Sandbox is a lease on one sandbox, as the gateway reports it.
type Sandbox struct {
	ID           string            `json:"id"`
	Pool         string            `json:"pool"`
	State        string            `json:"state"`            // StateActive, StateReleased, StateExpired or StateLost
	Reason       string            `json:"reason,omitempty"` // why the lease ended, when it did
	Generation   int64             `json:"generation"`
	CreatedAt    time.Time         `json:"created_at"`
	ExpiresAt    time.Time         `json:"expires_at"`
	EndedAt      time.Time         `json:"ended_at,omitzero"` // when the lease ended; zero while active
	LeaseSeconds int               `json:"lease_seconds"`
	Labels       map[string]string `json:"labels,omitempty"`
}

// CreateSandboxRequest asks for a sandbox from a pool.
type CreateSandboxRequest struct {
	Pool string `json:"pool,omitempty"`
	// LeaseSeconds: 0 means the pool's default.
	LeaseSeconds int               `json:"lease_seconds,omitempty"`
	Env          map[string]string `json:"env,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	// IdempotencyKey, when set, is sent as the Idempotency-Key header: a
	// retried create with the same key returns the same sandbox.
	IdempotencyKey string `json:"-"`
}

// ListSandboxesRequest filters ListSandboxes; empty fields do not filter.
type ListSandboxesRequest struct {
	Pool   string
	State  string
	Labels map[string]string // every label must match
}

// Pool is one warm pool: its configuration and its current counts.
type Pool struct {
	Name                string  `json:"name"`
	Provider            string  `json:"provider"`
	Image               string  `json:"image"`
	CPU                 float64 `json:"cpu"`
	Memory              int     `json:"memory"` // MiB
	MinWarm             int     `json:"min_warm"`
	MaxTotal            int     `json:"max_total"`
	DefaultLeaseSeconds int     `json:"default_lease_seconds"`
	MaxLeaseSeconds     int     `json:"max_lease_seconds"`
	Ready               int     `json:"ready"`
	Launching           int     `json:"launching"`
	Leased              int     `json:"leased"`
	Stopping            int     `json:"stopping"`
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
	keys := make([]string, 0, len(req.Labels))
	for k := range req.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		q.Add("label", k+"="+req.Labels[k])
	}
	var out struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	err := c.do(ctx, call{method: http.MethodGet, route: route{path: "/v1/sandboxes"}, query: q}, &out)
	return out.Sandboxes, err
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
	var out struct {
		Pools []Pool `json:"pools"`
	}
	err := c.do(ctx, call{method: http.MethodGet, route: route{path: "/v1/pools"}}, &out)
	return out.Pools, err
}
