#!/usr/bin/env bash
# Installs schemathesis (pinned) into a venv under .cache/, for the API fuzz run of the live gateway
# from gateway/openapi.json (tests/apifuzz_test.go). Idempotent; prints the venv's python on stdout.
#   SCHEMATHESIS_VERSION  (default 4.32.5)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
pinned_venv .cache/schemathesis-venv schemathesis "${SCHEMATHESIS_VERSION:-4.32.5}" schemathesis
