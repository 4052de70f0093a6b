// Package warmpool keeps pools of ready sandbox tasks and hands them out as
// leases. It owns the lease-store contract (store.go), the pool
// configuration, and the Manager: acquire (warm or cold), heartbeat,
// release, the per-pool reconciler and the lease reaper.
//
// Files: config.go parses and validates the pools file (LoadPools,
// ParsePools); manager.go holds the Manager's lifecycle and lease calls;
// acquire.go the acquire path; reconcile.go the per-pool reconciler and
// launches; reaper.go the reaper and the orphan sweep; agents.go the Agents
// interface and its HTTP implementation; metrics.go the Prometheus
// collectors.
//
// Everything that matters is in the Store; the Manager's memory holds only
// wake-ups, backoff and bookkeeping, so a restarted gateway (or another
// replica on the same store) serves every live lease. Background work runs
// in goroutines that Start starts and Close stops and waits for: one
// reconciler per pool, the reaper, the orphan sweep, and the launches the
// reconcilers start. Every ownership decision is a conditional store write
// (ReserveTasks within max_total, Claim, UpdateTask on a version, EndLease),
// so racing replicas lose cleanly instead of overwriting each other.
//
// It depends on the providers contract and on agentapi, never on a concrete
// provider, a concrete store or the gateway.
package warmpool
