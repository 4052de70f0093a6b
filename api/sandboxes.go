package api

import "time"

// Sandbox states (Sandbox.State).
const (
	StateActive   = "active"
	StateReleased = "released"
	StateExpired  = "expired"
	StateLost     = "lost"
)

// Sandbox is a lease on one sandbox, as the gateway reports it (POST and
// GET /v1/sandboxes, heartbeat, DELETE). It never carries the agent's
// address or token.
type Sandbox struct {
	ID   string `json:"id"`
	Pool string `json:"pool"`
	// Image is the image its sandbox runs (its pool's), when the pool has
	// one ("host" for the process provider's).
	Image        string            `json:"image,omitempty"`
	State        string            `json:"state"`            // StateActive, StateReleased, StateExpired or StateLost
	Reason       string            `json:"reason,omitempty"` // why the lease ended, when it did
	Generation   int64             `json:"generation"`
	CreatedAt    time.Time         `json:"created_at"`
	ExpiresAt    time.Time         `json:"expires_at"`
	EndedAt      time.Time         `json:"ended_at,omitzero"` // when the lease ended; zero while active
	LeaseSeconds int               `json:"lease_seconds"`
	Labels       map[string]string `json:"labels,omitempty"`
}

// SandboxList is the answer of GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// CreateSandboxRequest is the body of POST /v1/sandboxes: every field is
// optional.
type CreateSandboxRequest struct {
	// Pool: "" means the gateway's default pool.
	Pool string `json:"pool,omitempty"`
	// LeaseSeconds: 0 means the pool's default.
	LeaseSeconds int               `json:"lease_seconds,omitempty"`
	Env          map[string]string `json:"env,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	// Image, instead of Pool, asks for a sandbox of any image the operator
	// allows: the gateway makes (or finds) an on-demand pool of it, of the
	// class named (Class; "" is the first class that serves the image),
	// with CPU, Memory and Disk (0: the class's; each within the class's
	// bounds). docs/API.md, "Images on demand".
	Image  string  `json:"image,omitempty"`
	Class  string  `json:"class,omitempty"`
	CPU    float64 `json:"cpu,omitempty"`
	Memory MiB     `json:"memory,omitempty"`
	Disk   MiB     `json:"disk,omitempty"`
	// FromCheckpoint, when set, is a checkpoint (of this API key) that is
	// restored into the sandbox before it is handed out; Pool "" then
	// means the checkpoint's pool, and a pool of another image is refused.
	FromCheckpoint string `json:"from_checkpoint,omitempty"`
	// IdempotencyKey travels as the Idempotency-Key header, not in the
	// body: a retried create with the same key returns the same sandbox.
	IdempotencyKey string `json:"-"`
}

// Pool is one warm pool: its configuration and its current counts (GET
// /v1/pools). MemoryMiB is the pool's memory in MiB (Memory is the same
// number under its older name, kept for clients that read it); DiskMiB is
// the pool's disk (its work directory's size) in MiB, absent when the pool
// sets none and its provider's default applies.
type Pool struct {
	Name                string  `json:"name"`
	Provider            string  `json:"provider"`
	Image               string  `json:"image"`
	CPU                 float64 `json:"cpu"`
	Memory              int     `json:"memory"` // MiB; deprecated: MemoryMiB
	MemoryMiB           int     `json:"memory_mib"`
	DiskMiB             int     `json:"disk_mib,omitempty"`
	MinWarm             int     `json:"min_warm"`
	MaxTotal            int     `json:"max_total"`
	DefaultLeaseSeconds int     `json:"default_lease_seconds"`
	MaxLeaseSeconds     int     `json:"max_lease_seconds"`
	Ready               int     `json:"ready"`
	Launching           int     `json:"launching"`
	Leased              int     `json:"leased"`
	Stopping            int     `json:"stopping"`
}

// PoolList is the answer of GET /v1/pools: the configured pools, and the
// classes of on-demand pools (GET /v1/images lists those).
type PoolList struct {
	Pools   []Pool  `json:"pools"`
	Classes []Class `json:"classes,omitempty"`
}
