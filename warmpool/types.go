package warmpool

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

// PoolStatus is a pool's configuration and its current counts.
type PoolStatus struct {
	PoolConfig
	Ready     int `json:"ready"`
	Launching int `json:"launching"`
	Leased    int `json:"leased"`
	Stopping  int `json:"stopping"`
}

// AcquireRequest asks for a new lease on a task of Pool.
type AcquireRequest struct {
	Pool  string
	Owner string
	// LeaseSeconds: 0 means the pool's default; above the pool's maximum is
	// a badinput.Error.
	LeaseSeconds   int
	Env            map[string]string
	Labels         map[string]string
	IdempotencyKey string
	// Layer names a layer the pool's provider prepared (PrepareLayer):
	// the lease gets a new task started on it, never a ready one. It is
	// how the request is served, not what it asks for: Digest leaves it out.
	Layer string
}

// Digest is a digest of what the request asks for (pool, lease seconds as
// asked, env and labels), kept with a lease made under an idempotency key
// (Lease.RequestDigest) so that a replay can be checked against it.
func (r AcquireRequest) Digest() string {
	b, _ := json.Marshal(struct {
		Pool         string            `json:"pool"`
		LeaseSeconds int               `json:"lease_seconds"`
		Env          map[string]string `json:"env"`
		Labels       map[string]string `json:"labels"`
	}{r.Pool, r.LeaseSeconds, r.Env, r.Labels}) // map keys sorted: canonical
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}
