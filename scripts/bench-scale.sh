#!/usr/bin/env bash
# make bench-scale: the fleet simulation (issue 13; bench/scalebench, docs/BENCHMARKS.md).
# Real gateway binaries (2 replicas by default: QUARRY_PROVIDER=ecs, QUARRY_STORE=dynamodb) on
# simulated ECS/Fargate (bench/ecssim), simulated agents (bench/agentsim) and the DynamoDB
# simulator (bench/ddbsim), at 1k, 4k and 10k sandboxes. Every figure that depends on a simulator
# is labelled simulated. Nothing leaves 127.0.0.1; no AWS account is used (AWS_* and QUARRY_* of
# the caller's environment are not passed to the gateways).
#
#   make bench-scale                                   # 1000,4000,10000 at time scale 0.2 (~15-25 min)
#   SIZES=1000 TIME_SCALE=0.1 make bench-scale         # one size
#   scripts/bench-scale.sh -replicas 3 -window 10m     # any scalebench flag (go run ./bench/scalebench/cmd/scalebench -h)
#
# Results: printed, and written to .cache/bench/scale.json and .cache/bench/scale.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.cache/bench
mkdir -p "$out" bin
go build -o bin/gateway ./cmd/gateway
go build -o bin/agentsim ./bench/agentsim/cmd/agentsim
go build -o bin/ddbsim ./bench/ddbsim/cmd/ddbsim
go build -o bin/scalebench ./bench/scalebench/cmd/scalebench
echo "== machine"
lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core)' || true
grep MemTotal /proc/meminfo
bin/scalebench -bin bin -sizes "${SIZES:-1000,4000,10000}" -time-scale "${TIME_SCALE:-0.2}" \
  -replicas "${REPLICAS:-2}" -json "$out/scale.json" "$@" | tee "$out/scale.txt"
