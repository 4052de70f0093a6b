#!/usr/bin/env bash
# Installs E2B's Python SDK (e2b, unmodified, from the package index) at each
# pinned version into its own venv under .cache/, for the E2B compatibility
# tests (tests/e2b_sdk_test.go, tests/e2b/, docs/E2B.md). Idempotent: a venv
# that already has its version is left alone. Prints "version=python" pairs
# (absolute paths) joined by commas.
#   E2B_SDK_VERSIONS  space-separated versions (default: 2.63.0, the newest
#                     pinned; 2.50.0, the last that creates through
#                     /sandboxes; 2.31.0, which peers pin)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh

read -r -a versions <<<"${E2B_SDK_VERSIONS:-2.63.0 2.50.0 2.31.0}"
out=()
for version in "${versions[@]}"; do
	py="$(pinned_venv ".cache/e2b-venv-$version" e2b "$version" "from e2b import Sandbox, AsyncSandbox, CommandExitException")"
	out+=("$version=$py")
done
(IFS=,; echo "${out[*]}")
