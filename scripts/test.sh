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

started_emulator=""
run_started="$(date +%s)"
run_tmp=""
checked=""
cleanup() {
  if [ -n "$started_emulator" ]; then localstack/emulator.sh stop || true; fi
  if [ -n "$run_tmp" ]; then
    # A suite that failed or was interrupted may have left something: name it.
    [ -n "$checked" ] || scripts/leftovers.sh --since "$run_started" --tmp "$run_tmp" || true
    chmod -R u+w "$run_tmp" 2>/dev/null || true # tests make read-only trees
    rm -rf "$run_tmp" # agents whose directory went exit by themselves
  fi
}
trap cleanup EXIT

echo "== dependencies"
ensure_apt busybox-static test -x /bin/busybox
ensure_apt curl command -v curl
ensure_apt jq command -v jq # the README's blocks (tests/readme_test.go)
ensure_apt chromium command -v chromium # the console's browser test (tests/console_test.go)
scripts/docker-up.sh
scripts/images/build.sh
QUARRY_TEST_PYTHONPATH="$(scripts/python-deps.sh)"
export QUARRY_TEST_PYTHONPATH
QUARRY_ROCK_PYTHON="$(scripts/rock-sdk.sh)"
export QUARRY_ROCK_PYTHON
scripts/python-sdk-deps.sh >/dev/null # the Python SDK's test venv (its step below uses it)

start_emulator() {
  localstack/emulator.sh stop >/dev/null 2>&1 || true
  localstack/emulator.sh start
  started_emulator=1
}
if [ -z "${AWS_ENDPOINT_URL:-}" ]; then
  export AWS_ENDPOINT_URL=http://127.0.0.1:4566 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
  if localstack/emulator.sh status; then
    echo "== using the emulator already answering on 127.0.0.1:4566"
  else
    start_emulator
  fi
else
  echo "== AWS suites against AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL"
fi
export QUARRY_TEST_BUSYBOX=/bin/busybox QUARRY_TEST_DOCKER=1 QUARRY_TEST_AWS=1
# Debian's chromium (apt-get install -y chromium): the console's browser test and CDP through a preview URL.
QUARRY_TEST_CHROMIUM="$(command -v chromium)"
export QUARRY_TEST_CHROMIUM
# Every go test below runs strict: a test whose dependency is not given fails instead of skipping.
export QUARRY_TEST_STRICT=1
# Everything the suites create in temp dirs (t.TempDir, built binaries, gateways' data dirs) is in
# run_tmp, so what still runs from it at the end is this run's leftover.
run_tmp="$(mktemp -d "${TMPDIR:-/tmp}/quarry-make-test.XXXXXX")"
export TMPDIR="$run_tmp"
# The AWS suites run on their own, one package at a time (the emulator answers one request at a time).
aws_pkgs=(warmpool/dynamostore modelservice/dynamobroker checkpoints/s3store providers/ecs cmd/gateway)

echo "== go vet"
go vet ./...
go vet -tags integration ./tests/...

echo "== unit and component tests (race detector; Docker, busybox; the AWS suites' packages run next)"
module="$(go list -m)"
mapfile -t other_pkgs < <(go list ./... | grep -vxF -f <(printf "$module/%s\n" "${aws_pkgs[@]}"))
go test -race -count=1 "${other_pkgs[@]}"

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

echo "== leftovers: agents, gateways, test containers and the emulator this run started must be gone"
moto_pid=""
if [ -n "$started_emulator" ]; then
  moto_pid="$(cat .cache/moto.pid 2>/dev/null || true)"
  localstack/emulator.sh stop
  started_emulator=""
fi
checked=1
scripts/leftovers.sh --since "$run_started" --tmp "$run_tmp" --wait 15 ${moto_pid:+--moto-pid "$moto_pid"}

echo "== all suites passed"
