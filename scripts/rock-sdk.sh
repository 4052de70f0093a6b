#!/usr/bin/env bash
# Installs ROCK's Python SDK (rl-rock, pinned) into a venv under .cache/, for
# the ROCK compatibility tests (tests/rock_*_test.go, docs/ROCK.md).
# Idempotent: a venv that already has the pinned version is left alone.
# Prints the venv's python on stdout.
#   ROCK_SDK_VERSION  rl-rock version (default 1.11.0)
#   ROCK_SDK_VENV     venv directory (default .cache/rock-venv)
set -euo pipefail
cd "$(dirname "$0")/.."

version="${ROCK_SDK_VERSION:-1.11.0}"
venv="${ROCK_SDK_VENV:-.cache/rock-venv}"
py="$venv/bin/python"

installed() {
	[ -x "$py" ] && "$py" - "$version" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version("rl-rock") == sys.argv[1]
import rock.sdk.sandbox.client, rock.sdk.envs  # what the drivers use
PY
}

if ! installed; then
	echo "installing rl-rock==$version into $venv" >&2
	python3 -m venv "$venv"
	"$py" -m pip install --quiet --disable-pip-version-check "rl-rock==$version" >&2
	installed || { echo "rl-rock==$version installed but does not import" >&2; exit 1; }
fi
echo "$(cd "$venv" && pwd)/bin/python" # absolute: the tests run in other directories
