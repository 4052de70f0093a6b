#!/usr/bin/env bash
# make bench: Quarry's benchmarks, measured in one run on this machine, with p50/p99 and ratios.
#  1. quarrybench: real gateway, real agents (process provider), embedded store, over loopback
#  2. quarrybench -suite replicas: three gateways on DynamoDB (the local emulator, or AWS_ENDPOINT_URL)
#  3. dockerbench: the Docker provider (cold and warm starts, refill of a pool of 50)
#  3b. ckbench: checkpoints on Docker with a warm pool (checkpoint, restore in place,
#     from_checkpoint, fork x8 and x64, beside a cold start + upload), 10 MB and 100 MB workspaces
#  4. relaybench: the model relay (memory and DynamoDB brokers, passthrough, 1,000 sandboxes)
#  5. envbench: the env API (episodes of reset + 20 steps + close on the terminal task, 1 and 64
#     clients, step overhead over a session run)
#  5a. ptybench: a PTY keystroke's echo round trip through the gateway's WebSocket relay, p50/p99
#  5c. rockbench: ROCK's unmodified SDK with the gateway's hold of nohup checks on and off (a nohup
#     arun of true; one ModelService anti_call_llm turn in Docker) and the same turn through the relay
#  5b. pysdk: the Python SDK (bench/pysdk): a session run's overhead over raw httpx, and one asyncio
#     process driving 1,000 sandboxes (acquire, 10 session runs each, release; the client's CPU)
#  5d. e2bbench: E2B's unmodified SDK (the newest pinned) on Quarry: commands.run("true") beside
#     Quarry's Python SDK on the same sandbox, and 100 sandboxes created and running commands at once
#  6. the ECS launch controller against a fake that enforces AWS's limits
#  7. Go micro-benchmarks of the store, the warm pool and the agent
#  8. peers: SWE-ReX's swerex-remote and ROCK's rocklet beside Quarry's agent (scripts/bench-peers.sh)
# Results are printed and written to .cache/bench/ (JSON + text). Dependencies are set up as in
# make test (Docker engine and images, the emulator).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
out=.cache/bench
mkdir -p "$out"

started_emulator=""
cleanup() { if [ -n "$started_emulator" ]; then localstack/emulator.sh stop || true; fi; }
trap cleanup EXIT
scripts/docker-up.sh
scripts/images/build.sh
if [ -z "${AWS_ENDPOINT_URL:-}" ]; then
  export AWS_ENDPOINT_URL=http://127.0.0.1:4566 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
  if ! localstack/emulator.sh status; then
    localstack/emulator.sh start
    started_emulator=1
  fi
fi

run() { # run NAME CMD...: print a header, tee the output to $out/NAME.txt
  local name="$1"; shift
  echo
  echo "== $name"
  "$@" | tee "$out/$name.txt"
}

run quarrybench go run ./bench/quarrybench -bin bin -json "$out/quarrybench.json"
run replicas go run ./bench/quarrybench -bin bin -suite replicas -json "$out/replicas.json"
run dockerbench go run ./bench/dockerbench -bin bin -json "$out/dockerbench.json"
run ckbench go run ./bench/ckbench -bin bin -json "$out/ckbench.json"
run relaybench go run ./bench/relaybench -dynamodb -json "$out/relaybench.json"
run envbench go run ./bench/envbench -bin bin -json "$out/envbench.json"
run portbench go run ./bench/portbench -bin bin -json "$out/portbench.json"
run ptybench go run ./bench/ptybench -bin bin -json "$out/ptybench.json"
run rockbench go run ./bench/rockbench -bin bin -python "$(scripts/rock-sdk.sh)" -json "$out/rockbench.json"
run pysdk "$(scripts/python-sdk-deps.sh)" bench/pysdk/bench.py --bin bin --json "$out/pysdk.json"
e2b_py="$(E2B_SDK_VERSIONS=2.63.0 scripts/e2b-sdk.sh | cut -d= -f2)"
run e2bbench "$e2b_py" bench/e2bbench/bench.py --bin bin --json "$out/e2bbench.json"
run ecs go test -run '^$' -bench . -benchtime 50x ./providers/ecs/
run warmpool go test -run '^$' -bench 'BenchmarkStore_Claim|BenchmarkManager_AcquireWarm' -benchtime=2000x ./warmpool/ ./warmpool/boltstore/
run execagent go test -run '^$' -bench 'BenchmarkSession|BenchmarkExec|BenchmarkSpawnBash' -benchtime=3000x ./execagent/
run peers scripts/bench-peers.sh bin/execagent --json "$out/peers.json"
