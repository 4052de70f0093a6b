#!/usr/bin/env bash
# make flake-hunt: hunt the tests that fail one run in twenty. make test's race-enabled suites (its
# "unit and component tests" step: every package but the AWS suites', under -race) run COUNT times
# (-count, default 20, in a shuffled order: -shuffle=on), while stress-ng keeps one CPU worker per
# core busy, with every dependency make test gives them (scripts/test-env.sh). At the end it prints,
# per test that failed, how many of its runs failed, and exits 1 if any did.
#
#   make flake-hunt                          # every race-enabled package, 20 runs each
#   COUNT=50 PKGS="./gateway ./warmpool" RUN='WS|Shutdown' make flake-hunt
#   STRESS=0 make flake-hunt                 # without the CPU pressure
#   SUITE=aws|integration make flake-hunt    # the AWS suites (-p 1), or tests/ (-tags integration)
#
# The output of every run is kept in .cache/flake-hunt/ (go test -json, and a summary).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh

count="${COUNT:-20}"
suite="${SUITE:-race}"
run_re="${RUN:-}"
out=.cache/flake-hunt
mkdir -p "$out"
stress_pid=""
hunt_cleanup() {
  if [ -n "$stress_pid" ]; then kill -- "-$stress_pid" 2>/dev/null || kill "$stress_pid" 2>/dev/null || true; fi
  test_env_cleanup
}
trap hunt_cleanup EXIT
source scripts/test-env.sh # dependencies, the emulator, strict mode, the run's temp dir

args=(-count="$count" -shuffle=on -json)
[ -n "$run_re" ] && args+=(-run "$run_re")
case "$suite" in
  race)
    if [ -n "${PKGS:-}" ]; then read -r -a pkgs <<<"$PKGS"; else pkgs=("${race_pkgs[@]}"); fi
    args+=(-race -timeout "$((count * 10))m") ;;
  aws)
    if [ -n "${PKGS:-}" ]; then read -r -a pkgs <<<"$PKGS"; else pkgs=("${aws_pkgs[@]/#/./}"); fi
    args+=(-race -p 1 -timeout "$((count * 30))m") ;;
  integration)
    pkgs=(./tests/...)
    args+=(-tags integration -timeout "$((count * 30))m") ;;
  *) echo "flake-hunt: SUITE must be race, aws or integration, not $suite" >&2; exit 2 ;;
esac

if [ "${STRESS:-1}" != 0 ]; then
  ensure_apt stress-ng command -v stress-ng
  workers="$(nproc)"
  # Its own process group, so that the trap stops every worker.
  setsid stress-ng --cpu "$workers" --timeout 0 --quiet &
  stress_pid=$!
  echo "== CPU pressure: stress-ng --cpu $workers (pid $stress_pid)"
fi

log="$out/$suite-$(date +%Y%m%d-%H%M%S).json"
echo "== go test ${args[*]} ${pkgs[*]}  (log: $log)"
status=0
go test "${args[@]}" "${pkgs[@]}" >"$log" || status=$?
python3 scripts/flake-summary.py "$log" "$count" | tee "${log%.json}.txt"
summary_status=${PIPESTATUS[0]}
if [ "$status" != 0 ] || [ "$summary_status" != 0 ]; then
  echo "== flake-hunt: failures (go test exit $status); the log of each failed test is in $log" >&2
  exit 1
fi
echo "== flake-hunt: $count runs of every test passed"
