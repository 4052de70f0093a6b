#!/usr/bin/env bash
# make bench: Quarry's benchmarks, measured in one run on this machine, with p50/p99 and ratios.
#  1. quarrybench: real gateway, real agents (process provider), embedded store, over loopback
#  2. Go micro-benchmarks of the store, the warm pool and the agent
#  3. peers: SWE-ReX's swerex-remote and ROCK's rocklet beside Quarry's agent (scripts/bench-peers.sh)
# Results are printed and written to .cache/bench/ (JSON + text).
set -euo pipefail
cd "$(dirname "$0")/.."
out=.cache/bench
mkdir -p "$out"

echo "== quarrybench (gateway + agents + embedded store, real processes on loopback)"
go run ./bench/quarrybench -bin bin -json "$out/quarrybench.json" | tee "$out/quarrybench.txt"

echo
echo "== Go micro-benchmarks"
go test -run '^$' -bench 'BenchmarkStore_Claim|BenchmarkManager_AcquireWarm' -benchtime=2000x ./warmpool/... | tee "$out/warmpool.txt"
go test -run '^$' -bench 'BenchmarkSession|BenchmarkExec|BenchmarkSpawnBash' -benchtime=3000x ./execagent/ | tee "$out/execagent.txt"

echo
echo "== peers: swerex-remote and rocklet beside Quarry's agent (same Python client)"
scripts/bench-peers.sh bin/execagent --json "$out/peers.json" | tee "$out/peers.txt"
