#!/usr/bin/env bash
# make test: vet, unit tests, then the integration suites against real dependencies.
# A missing dependency is a failure, never a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== go vet"
go vet ./...
echo "== unit tests"
go test -count=1 ./...
