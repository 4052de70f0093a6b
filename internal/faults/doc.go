// Package faults is Quarry's fault-injection kit: a Recorder of operation
// histories, a Checker that holds a history to Quarry's promises (each
// lease's operations linearizable against the lease model, checked with
// porcupine; one holder per task; a refused command never ran; every call
// ends), a TCP Proxy that injects latency, resets and blackholes, and the
// nemesis's seeded Schedule.
//
// tests/faults_test.go drives a real cluster with it (make faults, and a
// short run in make test); docs/RELIABILITY.md says what it checks.
//
// It imports no Quarry package: the harness maps Quarry's answers to
// outcomes.
package faults
