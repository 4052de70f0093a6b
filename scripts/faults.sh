#!/usr/bin/env bash
# make faults: the fault-injection runs of tests/faults_test.go for longer than make test's (45 s and
# 30 s): three gateway replicas on DynamoDB (the emulator, through a serializing proxy and a fault
# proxy per replica), trainers' traffic, and a seeded nemesis (replicas killed and paused, the
# store's connections slowed, reset and blackholed, sandboxes killed, the data dir filled, the
# Docker engine restarted); then the history checker and the leftovers check. TestFaults runs on the
# process provider, TestFaults_Docker on Docker, each for DURATION.
#
#   make faults                                   # 10 minutes each, a random seed
#   SEED=1234 DURATION=2m make faults             # replay a seed's schedule
#   CLIENTS=8 KINDS=kill-replica,pause-replica make faults
#
# The history (JSON lines, one operation each) is kept in .cache/faults/faults-<seed>.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
trap test_env_cleanup EXIT
source scripts/test-env.sh # dependencies, the emulator, strict mode

export QUARRY_FAULTS_DURATION="${DURATION:-10m}"
[ -n "${SEED:-}" ] && export QUARRY_FAULTS_SEED="$SEED"
[ -n "${CLIENTS:-}" ] && export QUARRY_FAULTS_CLIENTS="$CLIENTS"
[ -n "${KINDS:-}" ] && export QUARRY_FAULTS_KINDS="$KINDS"
export QUARRY_FAULTS_OUT="$PWD/.cache/faults"
export QUARRY_FAULTS_RESTART_ENGINE=1 # the Docker run restarts the engine too
echo "== faults: $QUARRY_FAULTS_DURATION of traffic under faults (history in $QUARRY_FAULTS_OUT)"
go test -tags integration -count=1 -timeout 2h -run '^TestFaults(_Docker)?$' -v ./tests/
