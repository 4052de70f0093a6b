//go:build !benchfarm

package main

// addBenchProviders adds nothing: only a gateway built with the tag
// benchfarm has the benchmarks' farm provider (farm.go).
func addBenchProviders(map[string]providerMaker) {}
