// Package testenv is the one place a Quarry test asks whether a dependency
// outside Go is there: the AWS API emulator (AWS), a Docker engine and its
// test images (Docker), image registries on 127.0.0.1 (Registry,
// RegistryAuth), a static busybox (Busybox), Python packages for
// sandboxed programs (PythonPath), ROCK's Python SDK (RockPython), E2B's (E2BPythons) and a
// headless Chromium for browser tests (Chromium).
//
// Each dependency is asked for with an environment variable (the package's
// Env constants), which scripts/test.sh (make test) sets after installing or
// starting the dependency. A test calls the dependency's function first;
// then:
//
//   - the variable is not set, under plain `go test`: the test is skipped
//     (t.Skip) with a message saying what it needs and how to get it, so
//     the output says SKIP, never PASS, for a test that did not run;
//   - the variable is not set, with QUARRY_TEST_STRICT=1 (make test sets it
//     for every `go test` it runs): the test fails (t.Fatal) with the same
//     message — under make test a missing dependency is a failure;
//   - the variable is set but the dependency does not answer (nothing on
//     the endpoint, no engine, no such binary, a package that does not
//     import) or has a value the package does not know: the test fails,
//     strict or not;
//   - the dependency is there: the function returns (with the dependency's
//     address or path, where it has one) and the test runs.
//
// A test never returns early instead: that prints PASS for a test that did
// not run.
//
// This package is for tests only. It imports only the standard library (its
// own tests use testify), so that the tests of any package, down to the
// internal ones, can use it without an import cycle or linking an SDK: it
// must not import any Quarry package or any module outside the standard
// library.
package testenv
