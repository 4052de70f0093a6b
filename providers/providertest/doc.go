// Package providertest is the conformance suite every providers.Provider
// passes: Run launches, describes, lists, stops and kills real tasks and
// talks to their exec agents. A backend is done when its test calls Run with
// a Harness and the suite passes. Provider-specific knowledge (how to open a
// provider on fresh state, how to kill a task from outside) stays in the
// Harness hooks. BuildAgent builds the exec agent for suites that run it.
//
// A backend whose tasks exist only as API records (an emulator that starts
// nothing) sets Harness.NoAgents to say so: the suite then runs every check
// it can make on the records and skips, visibly (subtests Agent_*, SKIP with
// that reason), the checks that talk to an agent. The suite never answers
// for an agent itself.
//
// This package is for tests only. It must not import gateway, warmpool or
// any concrete provider.
package providertest
