// Package warmpool keeps pools of ready sandbox tasks and hands them out as
// leases. It owns the lease-store contract (store.go), the pool
// configuration, and the Manager: acquire (warm or cold), heartbeat,
// release, the per-pool reconciler and the lease reaper.
//
// Files: config.go parses and validates the pools file (LoadPools,
// ParsePools); manager_config.go the Manager's Config (defaults,
// Validate); manager.go the Manager, New and its Start/Close lifecycle;
// leases.go the lease calls (Get, Heartbeat, Release, List, CheckTask);
// stop.go retiring ended leases (fence, stop, delete); stale.go tasks of
// another configuration of their pool (TaskRecord.Spec) and the providers
// built to stop them; acquire.go the
// acquire path; reconcile.go the per-pool reconciler and
// launches; reaper.go the reaper and the orphan sweep; locks.go the locks
// that gate background work across replicas; cache.go the short lease
// cache; caller.go the caller marks on store calls (CallerOf); agents.go
// the Agents interface and its HTTP implementation; metrics.go the
// Prometheus collectors.
//
// Everything that matters is in the Store; the Manager's memory holds only
// wake-ups, backoff, bookkeeping and a lease cache of about a second, so a
// restarted gateway (or another replica on the same store) serves every
// live lease. Background work runs in goroutines that Start starts and
// Close stops and waits for: one reconciler per pool, the reaper, the
// orphan sweep, and the launches the reconcilers start. Where no process
// lives between requests (AWS Lambda), RunOnce runs the same passes once
// instead, lock-gated the same way, and returns when they are done.
//
// Many replicas may share one store. Each background pass runs only on the
// replica that holds its lock (Store.TryLock: an expiring lease in the
// store, held by Config.ReplicaID), and a replica that dies is replaced
// when its locks expire; acquires, heartbeats and releases take no lock.
// Every ownership decision is a conditional store write (ReserveTasks
// within max_total, Claim, UpdateTask on a version, EndLease), so racing
// replicas lose cleanly instead of overwriting each other, locks or not.
//
// It depends on the providers contract and on agentapi, never on a concrete
// provider, a concrete store or the gateway.
package warmpool
