// Package envs is the Gym-style env API (docs/ENVS.md): a registry of envs
// (env id → pool, the env program inside the image, its defaults), the
// JSON-lines protocol spoken with env programs, and the Service that the
// gateway's env routes (and any other route set, such as ROCK's GEM API)
// call: Make, Reset, Step and Close.
//
// The Service keeps no state of its own. A sandbox made by Make carries its
// env id in the lease label LabelEnv, and the env program runs inside the
// sandbox as the agent's rpc process named ProcessName; every call finds both
// again from the sandbox id, so any gateway replica serves any env.
//
// Files: registry.go parses and validates the registry file; protocol.go
// encodes requests and validates replies; service.go is the Service and the
// Sandboxes/Agent interfaces it needs; errors.go its errors. The subpackage
// envclient is a Go client of the gateway's env routes.
//
// It must not import gateway, warmpool, providers or any store: the caller
// adapts its lease handling to Sandboxes.
package envs
