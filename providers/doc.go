// Package providers holds the contract every sandbox backend implements
// (provider.go): launching tasks for a pool, describing, stopping and listing
// them, and the optional capabilities a backend may add, discovered by type
// assertion (StartSlots, Watcher, ImagePreparer, ImageCache, ImageBuilder,
// SandboxRelay, Closer). Backends live in subpackages named by a noun
// (process, docker, ecs); providertest is the conformance suite they all
// pass.
//
// This package must not import any other Quarry package.
package providers
