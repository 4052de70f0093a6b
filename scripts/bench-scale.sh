#!/usr/bin/env bash
# make bench-scale: issue 13's scale benchmarks (docs/BENCHMARKS.md, "Scale"), two parts:
#  1. the fleet simulation (bench/scalebench);
#  2. real sandboxes on this machine (bench/quarrybench -suite fleet): 1,000 process-provider
#     sandboxes leased at once, warm and cold, then Docker as far as one host allows. REAL=0 skips it.
# Real gateway binaries (2 replicas by default: QUARRY_PROVIDER=ecs, QUARRY_STORE=dynamodb) on
# simulated ECS/Fargate (bench/ecssim), simulated agents (bench/agentsim) and the DynamoDB
# simulator (bench/ddbsim), at 1k, 4k and 10k sandboxes. Every figure that depends on a simulator
# is labelled simulated. Nothing leaves 127.0.0.1; no AWS account is used (AWS_* and QUARRY_* of
# the caller's environment are not passed to the gateways).
#
#   make bench-scale                                   # 1000,4000,10000 at time scale 0.2 (~15-25 min)
#   SIZES=1000 TIME_SCALE=0.1 REAL=0 make bench-scale  # one size, no real sandboxes
#   scripts/bench-scale.sh -replicas 3 -window 10m     # any scalebench flag (go run ./bench/scalebench/cmd/scalebench -h)
#
# SCENARIO=images runs issue 22's images scenario instead (and no real sandboxes): N sandboxes
# (SIZES, default 10000) over IMAGES distinct task images (default 2000), without and then with a
# prefetch of the batch, against the floor of AWS's RegisterTaskDefinition and launch rates:
#
#   SCENARIO=images make bench-scale                          # 10,000 over 2,000 (~30 min at 0.2)
#   SCENARIO=images SIZES=500 IMAGES=100 make bench-scale     # the smoke size (~6 min)
#
# Results: printed, and written to .cache/bench/scale.{json,txt} and .cache/bench/fleet-real.{json,txt}
# (the images scenario: .cache/bench/images.{json,txt}).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${SCENARIO:-fleet}" in
  fleet | images) ;;
  *) echo "SCENARIO: want fleet (the default) or images, got ${SCENARIO}" >&2; exit 2 ;;
esac
out=.cache/bench
mkdir -p "$out" bin
go build -o bin/gateway ./cmd/gateway
go build -o bin/agentsim ./bench/agentsim/cmd/agentsim
go build -o bin/ddbsim ./bench/ddbsim/cmd/ddbsim
go build -o bin/scalebench ./bench/scalebench/cmd/scalebench
CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o bin/execagent ./cmd/execagent
go build -o bin/quarrybench ./bench/quarrybench
echo "== machine"
lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core)' || true
grep MemTotal /proc/meminfo
if [ "${SCENARIO:-fleet}" = images ]; then
  bin/scalebench -bin bin -images "${IMAGES:-2000}" -sizes "${SIZES:-10000}" -time-scale "${TIME_SCALE:-0.2}" \
    -replicas "${REPLICAS:-2}" -json "$out/scale-images.json" "$@" | tee "$out/scale-images.txt"
  exit "${PIPESTATUS[0]}"
fi
bin/scalebench -bin bin -sizes "${SIZES:-1000,4000,10000}" -time-scale "${TIME_SCALE:-0.2}" \
  -replicas "${REPLICAS:-2}" -json "$out/scale.json" "$@" | tee "$out/scale.txt"
if [ "${REAL:-1}" != 0 ]; then
  echo "== real sandboxes on this machine (process provider, embedded store; then Docker)"
  bin/quarrybench -bin bin -suite fleet -fleet-n "${REAL_N:-1000}" -json "$out/fleet-real.json" | tee "$out/fleet-real.txt"
fi
