package api

import "time"

// Checkpoint is one checkpoint of a sandbox's paths, as the gateway
// reports it (POST /v1/sandboxes/{id}/checkpoints, GET /v1/checkpoints and
// /v1/checkpoints/{id}). It belongs to the API key that made it and
// outlives its sandbox until it is deleted or it expires.
type Checkpoint struct {
	ID        string            `json:"id"`      // "ckp-" and 26 base32 characters
	Pool      string            `json:"pool"`    // the pool of the sandbox it was taken from
	Image     string            `json:"image"`   // that pool's image: a restore needs the same
	Sandbox   string            `json:"sandbox"` // the sandbox it was taken from
	Paths     []string          `json:"paths"`   // absolute paths in the sandbox
	Exclude   []string          `json:"exclude,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Format    string            `json:"format"`     // "tar" or "tar+gzip"
	SizeBytes int64             `json:"size_bytes"` // the archive's bytes, as stored
	Files     int               `json:"files"`      // entries: directories, files, symlinks
	SHA256    string            `json:"sha256"`     // hex of the archive's bytes
	CreatedAt time.Time         `json:"created_at"`
	ExpiresAt time.Time         `json:"expires_at"`
}

// CheckpointList is the answer of GET /v1/checkpoints: newest first.
type CheckpointList struct {
	Checkpoints []Checkpoint `json:"checkpoints"`
}

// CreateCheckpointRequest is the body of POST
// /v1/sandboxes/{id}/checkpoints: every field is optional.
type CreateCheckpointRequest struct {
	// Paths are absolute or relative to the sandbox's work dir; none: the
	// work dir.
	Paths []string `json:"paths,omitempty"`
	// Exclude are patterns of entries to leave out, relative to each path
	// (docs/API.md, "Checkpoints").
	Exclude []string          `json:"exclude,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
}

// RestoreRequest is the body of POST /v1/sandboxes/{id}/restore.
type RestoreRequest struct {
	Checkpoint string `json:"checkpoint"`
}

// RestoreResult is the answer of POST /v1/sandboxes/{id}/restore: the
// entries restored, the bytes of their regular files, and how long the
// sandbox's agent took.
type RestoreResult struct {
	SandboxID  string `json:"sandbox_id"`
	Checkpoint string `json:"checkpoint"`
	Files      int    `json:"files"`
	Bytes      int64  `json:"bytes"`
	DurationMS int64  `json:"duration_ms"`
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	// Count is how many sandboxes to make, 1 to 100 (required).
	Count int `json:"count"`
	// LeaseSeconds of each fork: 0 means the pool's default.
	LeaseSeconds int `json:"lease_seconds,omitempty"`
	// Paths and Exclude are those of the checkpoint the fork takes
	// (CreateCheckpointRequest's; none: the work dir).
	Paths   []string `json:"paths,omitempty"`
	Exclude []string `json:"exclude,omitempty"`
	// Labels of each fork's lease; none: the source sandbox's labels.
	Labels map[string]string `json:"labels,omitempty"`
	// KeepCheckpoint keeps the checkpoint the fork took (it is in the
	// answer); by default it is deleted once every fork is restored.
	KeepCheckpoint bool `json:"keep_checkpoint,omitempty"`
}

// ForkResult is the answer of POST /v1/sandboxes/{id}/fork: the
// checkpoint taken and one entry per fork, in order.
type ForkResult struct {
	Checkpoint Checkpoint `json:"checkpoint"`
	Forks      []Fork     `json:"forks"`
}

// Fork is one fork's outcome: its sandbox, or why it could not be made
// (Error; a fork past the pool's room is status 503, code no_capacity).
// One failing fork does not fail the others.
type Fork struct {
	Sandbox *Sandbox   `json:"sandbox,omitempty"`
	Error   *ForkError `json:"error,omitempty"`
}

// ForkError is a fork's failure: the status, code and message the same
// failure of POST /v1/sandboxes would answer.
type ForkError struct {
	Status  int    `json:"status"`
	Code    string `json:"code"`
	Message string `json:"message"`
}
