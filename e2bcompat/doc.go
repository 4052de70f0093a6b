// Package e2bcompat serves E2B's control plane — the REST routes of E2B's
// spec/openapi.yml that the e2b SDKs call (POST /sandboxes, connect, kill,
// list, timeout, …) — as fiber handlers over Quarry's leases, and holds what
// the gateway needs to know of E2B's data plane: how a request names its
// sandbox (RouteOf), envd's port and version, the SDK's signed file URLs
// (FileSignature), and E2B's error shapes (WriteError for the control plane,
// WriteProxyError for the data plane, both rendered from errclass).
// docs/ARCHITECTURE.md, "E2B's routes", says how each route maps.
//
// Files: route.go (routing a data-plane request; envd's port and version),
// signature.go (signed file URLs), errors.go (E2B's and Connect's error
// bodies), wire.go (the wire types, written from E2B's spec), service.go
// (Service, its Config, Deps and the interfaces it needs, Routes),
// sandboxes.go (the sandbox routes), snapshots.go (fork and snapshots
// over Quarry's checkpoints).
//
// The package keeps nothing in memory that matters: an E2B sandbox id is a
// lease id, its envdAccessToken a pure function of the lease
// (Deps.Token). The gateway authenticates callers (X-API-KEY), mints and
// checks tokens, routes the data plane and registers Routes
// (gateway/e2b.go). This package must not import gateway, a provider, a
// store or cmd/.
package e2bcompat
