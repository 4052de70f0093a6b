#!/usr/bin/env bash
# make test: every suite, against real dependencies, which this script installs or starts:
#   - busybox-static (POSIX-shell sessions), Docker engine + locally built images (Docker provider),
#     the AWS API emulator on 127.0.0.1:4566 (DynamoDB lease store and relay broker), Python's
#     openai package (run inside sandboxes by the relay tests), ROCK's SDK rl-rock (ROCK compatibility),
#     the Python SDK's test venv (scripts/python-sdk-deps.sh: pytest, httpx, mypy, build, openai, gymnasium).
# A missing dependency is a failure, never a skip: QUARRY_TEST_STRICT=1 (internal/testenv) makes
# every test that was not given its dependency fail. Set AWS_ENDPOINT_URL (and credentials, region)
# to run the AWS suites against LocalStack or real AWS instead of the local emulator.
# At the end nothing the suites started may still run (scripts/leftovers.sh names what does): the
# suites run with a temp dir of their own (TMPDIR), removed when the script ends.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh

trap test_env_cleanup EXIT
source scripts/test-env.sh # dependencies, the emulator, strict mode, the run's temp dir

echo "== go vet"
go vet ./...
go vet -tags integration ./tests/...

echo "== unit and component tests (race detector; Docker, busybox; the AWS suites' packages run next)"
go test -race -count=1 "${race_pkgs[@]}"

echo "== fuzz: every fuzz target of a parser of untrusted input, a few seconds each (scripts/fuzz.sh)"
scripts/fuzz.sh

echo "== AWS suites: DynamoDB lease store and relay broker (conformance, 10,000-claim race), S3 checkpoint store, ECS provider, Lambda mode"
go test -race -count=1 -p 1 -timeout 30m "${aws_pkgs[@]/#/./}"

echo "== LocalStack init hooks against the emulator (tables, ECS cluster, secret, task definition; idempotent)"
localstack/check-hooks.sh

# The emulator's memory grows with every table it ever held; a fresh one keeps the next suite fast.
[ -n "$started_emulator" ] && start_emulator

echo "== integration: real gateways, agents, stores, Docker, emulator, CLI, openai client"
go test -tags integration -count=1 -timeout 30m ./tests/...

echo "== Python SDK: sdk/python against a real gateway (every call, error classes, the 32-episode rollout), packaging, mypy"
scripts/test-python-sdk.sh

echo "== peer benchmark harness (unit tests)"
python3 -m unittest discover -s bench/peers

echo "== leftovers: agents, gateways, test containers, the emulator and registries this run started must be gone"
moto_pid=""
if [ -n "$started_emulator" ]; then
  moto_pid="$(cat .cache/moto.pid 2>/dev/null || true)"
  localstack/emulator.sh stop
  started_emulator=""
fi
stop_registry
checked=1
scripts/leftovers.sh --since "$run_started" --tmp "$run_tmp" --wait 15 ${moto_pid:+--moto-pid "$moto_pid"}

echo "== all suites passed"
