#!/usr/bin/env bash
# make test: vet, unit tests (with the race detector), then the integration suites against real
# dependencies, which this script installs or starts. A missing dependency is a failure, never a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh

echo "== dependencies"
ensure_apt busybox-static test -x /bin/busybox
command -v bash >/dev/null && command -v python3 >/dev/null

echo "== go vet"
go vet ./...
go vet -tags integration ./tests/...

echo "== unit tests (race detector)"
QUARRY_TEST_BUSYBOX=/bin/busybox go test -race -count=1 ./...

echo "== integration: gateway, process provider, exec agents, embedded store, CLI (real processes)"
go test -tags integration -count=1 ./tests/...

echo "== peer benchmark harness (unit tests)"
python3 -m unittest discover -s bench/peers

echo "== all suites passed"
