// Package warmpool keeps pools of ready sandbox tasks and hands them out as
// leases. It owns the lease-store contract (store.go), the pool and class
// configuration, and the Manager: acquire (warm or cold), heartbeat,
// release, on-demand pools made for the images requests name, the per-pool
// reconciler and launches, the lease reaper and the orphan sweep.
//
// Files:
//   - store.go: the lease-store contract (Store: TaskStore, LeaseStore,
//     PoolStore, Locker; the optional ReserveLimiter), its records, its
//     sentinel errors, the argument checks every store runs (Check*) and
//     ClaimedLease, the records every store writes for a claim.
//   - config.go: the pools file: PoolConfig, LoadPools and ParsePools, the
//     defaults (WithDefaults) and the validation (Validate).
//   - class.go: the classes of on-demand pools (ClassConfig), image
//     references and patterns, OnDemandPoolName.
//   - types.go: PoolStatus and AcquireRequest.
//   - manager_config.go: the Manager's Config (defaults, Validate).
//   - manager.go: Deps, the Manager, New, its Start/Close lifecycle, Ready
//     and Pools.
//   - acquire.go: Acquire: claim a ready task, wait in the pool's queue, or
//     cold-start a task; the agent's init.
//   - queue.go: a pool's bounded FIFO of waiting acquires.
//   - leases.go: the lease calls (Get, Heartbeat, Release, ByKey, List,
//     CheckTask).
//   - cache.go: the short lease cache.
//   - pool.go: the in-memory companion of one pool (wake-ups, launch
//     backoff, cold starts, health-check bookkeeping).
//   - reconcile.go: the per-pool reconcile loop and pass: the walk over the
//     pool's tasks (launch deadlines, stops, describes, health checks).
//   - launch.go: refills and launches: reserving tasks for the demand, the
//     providers' Launch calls, and moving tasks to ready or stopping.
//   - starter.go: a pool's starter, which makes launched tasks ready
//     (describes and health checks in batches).
//   - events.go: the providers' task events (watchEvents, handleEvent).
//   - stop.go: retiring ended leases (fence, stop, delete) and stopping
//     tasks.
//   - stale.go: tasks of another configuration of their pool
//     (TaskRecord.Spec) and the providers built to stop them.
//   - layers.go: tasks started on a checkpoint's copy-on-write layer
//     (PrepareLayer, DropLayer, AcquireRequest.Layer, ErrLayerFull).
//   - reaper.go: the reaper: ends expired leases, purges old ended ones.
//   - orphans.go: the orphan sweep: stops provider tasks that no record
//     accounts for and winds down pools no longer configured.
//   - locks.go: the locks that gate background work across replicas;
//     DefaultReplicaID.
//   - runonce.go: RunOnce, the background passes run once (Lambda).
//   - ondemand.go: on-demand pools: ImagePool (resolve, prepare and record
//     the pool), the class loops, acquire counts (TouchPool), idle pools
//     ending, Classes and Pool.
//   - images.go: Prefetch, Images, ImagesOf and BuildImage.
//   - ids.go: lease and task ids.
//   - caller.go: the caller marks on store calls (ContextWithCaller,
//     CallerOf).
//   - agents.go: the Agents interface and its HTTP implementation.
//   - metrics.go: the Prometheus collectors.
//
// Everything that matters is in the Store; the Manager's memory holds only
// wake-ups, backoff, bookkeeping and a lease cache of about a second, so a
// restarted gateway (or another replica on the same store) serves every
// live lease. Background work runs in goroutines that Start starts and
// Close stops and waits for: one reconciler per pool, one loop per class
// of on-demand pools, one event watch per provider that delivers events,
// the prefetch workers, the acquire-count flusher, the reaper, the orphan
// sweep, and the launches and starters that refills start. Where no
// process lives between requests (AWS Lambda), RunOnce runs the passes
// once instead, lock-gated the same way, and returns when they are done.
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
