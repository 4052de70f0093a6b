// Package storetest is the conformance suite of the lease store contract
// (warmpool/store.go). Every store implementation runs it from its own
// tests:
//
//	func TestStore_Conformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) warmpool.Store { ... }, storetest.Options{})
//	}
//
// A store is done when the suite passes, including its race tests, whose
// scale (tasks, claims, concurrent claimers, replicas) is set by Options.
//
// Files, named after the store files they test: storetest.go Options, Run
// (the list of tests) and the helpers every file shares; tasks.go the task
// records and their counts (warmpool.TaskStore) and their races; claim.go
// Claim, its idempotency keys and their races; spec.go claims of a pool's
// current configuration (TaskRecord.Spec); leases.go renewing, ending,
// listing, finding by key and purging leases; pools.go the on-demand pools
// and class reservations (warmpool.PoolStore) and their races; lock.go the
// named locks (warmpool.Locker) and their race; errors.go the refusals
// every call shares: the contract's argument checks, a canceled context, a
// closed store; latency.go the p50/p99 metrics that store and manager
// benchmarks report (ReportLatency).
//
// It imports only warmpool and test libraries; it must not import a
// concrete store, a provider or the gateway.
package storetest
