// Package warmpool keeps pools of ready sandbox tasks and hands them out as
// leases. It owns the lease-store contract (store.go), the pool
// configuration, and the Manager: acquire (warm or cold), heartbeat,
// release, the per-pool reconciler and the lease reaper.
//
// It depends on the providers contract and on agentapi, never on a concrete
// provider, a concrete store or the gateway.
package warmpool
