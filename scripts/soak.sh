#!/usr/bin/env bash
# make soak: one gateway (process provider, embedded store) under steady load for DURATION (default
# 30m): acquires, commands, sessions, files, PTYs, port requests, releases, and a sandbox's agent
# killed every minute. It samples the gateway's and a long-lived agent's RSS, goroutines/threads and
# open files every 10 s, fails on more than 5 % growth after the warm-up, and checks that the
# gateway's goroutines come back to their level before the load (tests/soak_test.go).
#
#   make soak                    # 30 minutes
#   DURATION=10m make soak
#   WORKERS=1 make soak          # a lighter load (default 4 workers)
#
# The samples are kept as CSV in .cache/soak/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
trap test_env_cleanup EXIT
source scripts/test-env.sh # dependencies, strict mode, the run's temp dir

export QUARRY_SOAK_DURATION="${DURATION:-30m}"
[ -n "${WORKERS:-}" ] && export QUARRY_SOAK_WORKERS="$WORKERS"
export QUARRY_SOAK_OUT="$PWD/.cache/soak"
echo "== soak: $QUARRY_SOAK_DURATION of steady load (samples in $QUARRY_SOAK_OUT)"
go test -tags 'integration soak' -count=1 -timeout 3h -run '^TestSoak$' -v ./tests/
