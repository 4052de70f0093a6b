package e2bcompat

import (
	"encoding/json"
	"time"
)

// The wire types of E2B's control plane, written from E2B's spec/openapi.yml
// (components.schemas, named alike). Only what Quarry reads or answers is
// declared; the SDK ignores fields it does not know, and a request's fields
// that Quarry does not serve are named where they are refused or ignored.

// NewSandbox is the body of POST /sandboxes (and /v2/sandboxes, whose
// NewSandboxV2 adds autoPauseMemory and memory, both ignored).
type NewSandbox struct {
	// TemplateID is required: a pool, E2B's default template "base", or an
	// image (Service.poolOf).
	TemplateID string `json:"templateID"`
	// Timeout is the time to live in seconds (0: the pool's default).
	Timeout  int               `json:"timeout"`
	Metadata map[string]string `json:"metadata"`
	EnvVars  map[string]string `json:"envVars"`
	// Refused when set: Quarry has no MCP gateway, workload identity or
	// volumes.
	MCP          json.RawMessage `json:"mcp"`
	IAM          json.RawMessage `json:"iam"`
	VolumeMounts json.RawMessage `json:"volumeMounts"`
	// Ignored: autoPause, autoPauseMemory, autoResume, secure,
	// allow_internet_access, network (docs/ARCHITECTURE.md, "E2B's routes").
}

// Sandbox is the answer of a create and a connect.
type Sandbox struct {
	TemplateID      string  `json:"templateID"`
	SandboxID       string  `json:"sandboxID"`
	Alias           string  `json:"alias,omitempty"`
	ClientID        string  `json:"clientID"`
	EnvdVersion     string  `json:"envdVersion"`
	EnvdAccessToken string  `json:"envdAccessToken,omitempty"`
	Domain          *string `json:"domain"`
}

// ListedSandbox is one sandbox of GET /v2/sandboxes.
type ListedSandbox struct {
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int               `json:"memoryMB"`
	DiskSizeMB  int               `json:"diskSizeMB"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
}

// SandboxDetail is the answer of GET /sandboxes/{id}: a ListedSandbox's
// fields and these.
type SandboxDetail struct {
	ListedSandbox
	EnvdAccessToken string     `json:"envdAccessToken,omitempty"`
	Domain          *string    `json:"domain"`
	Lifecycle       *Lifecycle `json:"lifecycle,omitempty"`
}

// Lifecycle is SandboxLifecycle: what happens at the timeout.
type Lifecycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

// The states of SandboxState, and the timeout actions of SandboxOnTimeout.
const (
	StateRunning  = "running"
	StatePaused   = "paused"
	OnTimeoutKill = "kill"
)

// TimeoutRequest is the body of POST /sandboxes/{id}/timeout and of a
// connect (SandboxTimeoutRequest, ConnectSandbox): seconds from now.
type TimeoutRequest struct {
	Timeout *int `json:"timeout"`
}

// RefreshRequest is the body of POST /sandboxes/{id}/refreshes
// (SandboxRefreshRequest): seconds from now, at most 3600.
type RefreshRequest struct {
	Duration *int `json:"duration"`
}

// SandboxLogs is the answer of GET /sandboxes/{id}/logs;
// SandboxLogsV2 of GET /v2/sandboxes/{id}/logs. Quarry records no sandbox
// logs: both are empty.
type SandboxLogs struct {
	Logs       []json.RawMessage `json:"logs"`
	LogEntries []json.RawMessage `json:"logEntries"`
}

// SandboxLogsV2 is SandboxLogsV2Response.
type SandboxLogsV2 struct {
	Logs []json.RawMessage `json:"logs"`
}

// ForkRequest is the body of POST /sandboxes/{id}/fork
// (SandboxForkRequest).
type ForkRequest struct {
	Timeout *int `json:"timeout"`
	Count   *int `json:"count"`
}

// ForkResult is one fork's outcome (SandboxForkResult): exactly one of
// Sandbox and Error.
type ForkResult struct {
	Sandbox *Sandbox `json:"sandbox,omitempty"`
	Error   *Error   `json:"error,omitempty"`
}

// SnapshotRequest is the body of POST /sandboxes/{id}/snapshots
// (SandboxSnapshotRequest).
type SnapshotRequest struct {
	Name string `json:"name"`
}

// SnapshotInfo is a snapshot: its id, usable as a templateID, and its
// names.
type SnapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}
