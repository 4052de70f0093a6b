# Sourced by scripts/test.sh and scripts/flake-hunt.sh (after scripts/deps.sh): installs or starts
# every dependency of the suites and exports what they read, so that both run the suites alike:
#   - busybox-static (POSIX-shell sessions), curl, Debian's chromium (the console's browser test),
#     the Docker engine and the locally built images, Python's openai package (run inside
#     sandboxes), ROCK's SDK rl-rock, the Python SDK's test venv;
#   - the AWS API emulator on 127.0.0.1:4566, unless AWS_ENDPOINT_URL names another endpoint
#     (LocalStack or AWS);
#   - two image registries on 127.0.0.1 (scripts/registry.sh: open on 5055, htpasswd on 5056) for
#     the Docker provider's pulls: QUARRY_TEST_REGISTRY, QUARRY_TEST_REGISTRY_AUTH and
#     QUARRY_TEST_REGISTRY_USER;
#   - QUARRY_TEST_STRICT=1: a test whose dependency is missing fails instead of skipping;
#   - TMPDIR: a temp dir of the run's own (run_tmp), so that what still runs from it at the end
#     is this run's leftover.
# It sets started_emulator, started_registry, run_started and run_tmp, and defines start_emulator,
# stop_registry and test_env_cleanup, which the caller's EXIT trap runs.
started_emulator=""
started_registry=""
run_started="$(date +%s)"
run_tmp=""
checked=""
# stop_registry stops the registries this run started (before a check for leftovers).
stop_registry() {
  if [ -n "$started_registry" ]; then scripts/registry.sh stop || true; fi
  started_registry=""
}
test_env_cleanup() {
  if [ -n "$started_emulator" ]; then localstack/emulator.sh stop || true; fi
  stop_registry
  if [ -n "$run_tmp" ]; then
    # A suite that failed or was interrupted may have left something: name it.
    [ -n "$checked" ] || scripts/leftovers.sh --since "$run_started" --tmp "$run_tmp" || true
    chmod -R u+w "$run_tmp" 2>/dev/null || true # tests make read-only trees
    rm -rf "$run_tmp" # agents whose directory went exit by themselves
  fi
}

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
QUARRY_E2B_PYTHONS="$(scripts/e2b-sdk.sh)"
export QUARRY_E2B_PYTHONS
QUARRY_SCHEMATHESIS_PYTHON="$(scripts/schemathesis.sh)"
export QUARRY_SCHEMATHESIS_PYTHON
# E2B's host routing (https://49983-{id}.{domain}) in tests/e2b_sdk_test.go: nss-myhostname resolves
# every name under .localhost to the loopback address, so no test edits /etc/hosts.
ensure_apt libnss-myhostname getent ahostsv4 e2b-probe.localhost
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
if scripts/registry.sh status; then
  echo "== using the image registries already answering (scripts/registry.sh)"
else
  scripts/registry.sh start
  started_registry=1
fi
while IFS= read -r kv; do export "${kv?}"; done < <(scripts/registry.sh env)
export QUARRY_TEST_BUSYBOX=/bin/busybox QUARRY_TEST_DOCKER=1 QUARRY_TEST_AWS=1
# Debian's chromium (apt-get install -y chromium): the console's browser test and CDP through a preview URL.
QUARRY_TEST_CHROMIUM="$(command -v chromium)"
export QUARRY_TEST_CHROMIUM
# Every go test runs strict: a test whose dependency is not given fails instead of skipping.
export QUARRY_TEST_STRICT=1
# Everything the suites create in temp dirs (t.TempDir, built binaries, gateways' data dirs) is in
# run_tmp, so what still runs from it at the end is this run's leftover.
run_tmp="$(mktemp -d "${TMPDIR:-/tmp}/quarry-make-test.XXXXXX")"
export TMPDIR="$run_tmp"
# The AWS suites run on their own, one package at a time (the emulator answers one request at a time).
aws_pkgs=(warmpool/dynamostore modelservice/dynamobroker checkpoints/s3store providers/ecs cmd/gateway)
module="$(go list -m)"
# race_pkgs: every other package, which make test runs under the race detector at once.
mapfile -t race_pkgs < <(go list ./... | grep -vxF -f <(printf "$module/%s\n" "${aws_pkgs[@]}"))
