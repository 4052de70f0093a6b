#!/usr/bin/env bash
# make test's "== Python SDK" step: sdk/python's pytest suite against a real gateway (process
# provider, embedded store) that the suite starts on a free 127.0.0.1 port with its data dir in a
# temp dir and stops at its end, with the binaries built here into a temp dir; the rollout example
# with 32 episodes; packaging (a fresh venv's pip install, a wheel, mypy strict). Dependencies come
# from scripts/python-sdk-deps.sh (pinned, cached under .cache/python-sdk).
set -euo pipefail
cd "$(dirname "$0")/.."
py="$(scripts/python-sdk-deps.sh)"
bin="$(mktemp -d "${TMPDIR:-/tmp}/quarry-pysdk-bin.XXXXXX")"
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/gateway" ./cmd/gateway
CGO_ENABLED=0 go build -trimpath -o "$bin/execagent" ./cmd/execagent
cd sdk/python
QUARRY_SDK_BIN_DIR="$bin" "$py" -m pytest -q --durations=5 "$@"
