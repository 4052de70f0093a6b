package warmpool

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
)

// PoolConfig is one pool as written in the pools file (YAML or JSON, path in
// QUARRY_POOLS_FILE): {"pools": [PoolConfig, ...]}.
type PoolConfig struct {
	Name string `json:"name"`
	// Provider names the backend ("process", "docker", "ecs"); empty means
	// the gateway's default provider (QUARRY_PROVIDER).
	Provider string `json:"provider,omitempty"`
	Image    string `json:"image,omitempty"`
	// CPU in vCPUs; Memory in MiB (a number, or a string such as "512Mi", "2Gi").
	// Disk bounds the sandbox's work directory, spelled as Memory is; 0
	// (unset) leaves its size to the provider, and a provider that cannot
	// enforce a size refuses a pool that sets one (docs/API.md, "Pools").
	CPU      float64 `json:"cpu,omitempty"`
	Memory   MiB     `json:"memory,omitempty"`
	Disk     DiskMiB `json:"disk,omitempty"`
	MinWarm  int     `json:"min_warm"`
	MaxTotal int     `json:"max_total"`
	// DefaultLeaseSeconds applies when a create request names none;
	// MaxLeaseSeconds bounds what a request may ask for.
	DefaultLeaseSeconds int `json:"default_lease_seconds,omitempty"`
	MaxLeaseSeconds     int `json:"max_lease_seconds,omitempty"`
	// StartupTimeoutSeconds bounds a launch until the agent answers /healthz.
	StartupTimeoutSeconds int               `json:"startup_timeout_seconds,omitempty"`
	Env                   map[string]string `json:"env,omitempty"`
	Labels                map[string]string `json:"labels,omitempty"`
	// Options are the provider's settings, except those in a gateway
	// service's namespace ("model.*": the model relay's, see
	// docs/MODELSERVICE.md), which never reach the provider
	// (ProviderOptions).
	Options map[string]string `json:"options,omitempty"`
}

// ServiceOptionPrefix is the namespace of the pool options that a gateway
// service reads from the pools file (the model relay's "model.*"); the
// provider does not see them.
const ServiceOptionPrefix = "model."

// ProviderOptions returns a copy of p.Options without the options of
// gateway services ("model.*"), or nil when none remain: what the pool's
// provider receives in providers.Spec.Options.
func (p PoolConfig) ProviderOptions() map[string]string {
	var out map[string]string
	for k, v := range p.Options {
		if strings.HasPrefix(k, ServiceOptionPrefix) {
			continue
		}
		if out == nil {
			out = make(map[string]string, len(p.Options))
		}
		out[k] = v
	}
	return out
}

// MiB is a memory size in mebibytes. In the pools file it is a number (MiB)
// or a string with a unit: "512Mi", "2Gi", "512m", "1g", "1024" (see
// UnmarshalJSON in config.go).
type MiB int

// DiskMiB is a disk size in mebibytes, spelled as MiB is (its parse errors
// name "disk").
type DiskMiB int

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

// SpecDigest is the digest of what a task of the pool is launched with:
// its provider, image, cpu, memory, disk, env and provider options (not
// its name, labels, lease bounds, warm counts or gateway service options,
// which a running task does not depend on). Tasks record it when they are
// reserved (TaskRecord.Spec), and a pool hands out only tasks of its own
// digest. Provider must be set (cmd/ defaults it before New).
func (p PoolConfig) SpecDigest() string {
	b, _ := json.Marshal(struct {
		Provider string            `json:"provider"`
		Image    string            `json:"image"`
		CPU      float64           `json:"cpu"`
		Memory   MiB               `json:"memory"`
		Disk     DiskMiB           `json:"disk"`
		Env      map[string]string `json:"env"`
		Options  map[string]string `json:"options"`
	}{p.Provider, p.Image, p.CPU, p.Memory, p.Disk, nilIfEmpty(p.Env), p.ProviderOptions()}) // map keys sorted: canonical
	sum := sha256.Sum256(b)
	return "v1:" + hex.EncodeToString(sum[:12])
}

// nilIfEmpty is m, or nil when it has no entries (an empty map and none
// digest the same).
func nilIfEmpty(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return m
}
