// Package checkpointtest is the conformance suite of the checkpoint-store
// contract (checkpoints.Store). Every store runs it from its own tests:
//
//	func TestStore_Conformance(t *testing.T) {
//		checkpointtest.Run(t, func(t *testing.T, s checkpointtest.Setup) checkpoints.Store { ... }, checkpointtest.Options{})
//	}
//
// newStore returns a new, empty store built with its Setup: it tells time
// by Setup.Clock only (the suite moves it to test expiry) and keeps
// Setup.Budget. It implements the suite's three test interfaces, Corrupter
// (damage a stored archive), BlobCounter (count stored archives, partial
// uploads included) and Reopener (close and open again on the same data):
// a backend's test wraps its store in a type that adds them. A store that
// lacks them fails the tests that need them. A store is done when the
// suite passes; budget.go holds the budget's rules.
//
// The suite checks memory by measurement: while a large archive streams
// in and out it samples the live heap (after a forced GC) and fails when
// it grew by more than Options.MaxBuffered, which must be well below the
// archive's size. Run the suite's package tests without t.Parallel
// neighbours that allocate.
//
// It imports only checkpoints, internal/clock, internal/badinput and test
// libraries; it must not import a concrete store or the gateway.
package checkpointtest
