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
// It imports only warmpool and test libraries; it must not import a
// concrete store, a provider or the gateway.
package storetest
