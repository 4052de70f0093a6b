#!/usr/bin/env bash
# Installs what the Python SDK's tests need (sdk/python; make test's "== Python SDK" step) into a
# venv under .cache/python-sdk, once: pinned versions, and a second run with the same pins does
# nothing. Also keeps a wheelhouse (.cache/python-sdk/wheels) of the SDK's build backend and runtime
# dependencies, so that the packaging test installs ./sdk/python into a fresh venv without a network.
#
#   scripts/python-sdk-deps.sh        install (idempotent) and print the venv's python
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/.cache/python-sdk"
venv="$dir/venv"
# The test tools, the SDK's one dependency (httpx) and its optional extras (openai, gymnasium).
pins=(httpx==0.28.1 pytest==9.2.0 mypy==2.4.1 build==1.6.1 hatchling==1.33.0 openai==3.51.0 gymnasium==1.4.0)
# What `pip install ./sdk/python` needs, offline: the build backend and httpx with its dependencies.
wheel_pins=(hatchling==1.33.0 httpx==0.28.1)
stamp="$dir/.installed-$(printf '%s\n' "${pins[@]}" "${wheel_pins[@]}" | sha256sum | cut -c1-16)"

command -v python3 >/dev/null || { echo "python-sdk-deps: python3 is required" >&2; exit 1; }
if [ -f "$stamp" ] && "$venv/bin/python" -c 'import httpx, pytest, mypy, build, openai, gymnasium' >/dev/null 2>&1; then
  echo "$venv/bin/python"
  exit 0
fi
echo "python-sdk-deps: installing ${pins[*]} into $venv" >&2
rm -rf "$dir.tmp"
mkdir -p "$dir.tmp"
python3 -m venv "$dir.tmp/venv"
pip=("$dir.tmp/venv/bin/python" -m pip -q --disable-pip-version-check --no-input)
"${pip[@]}" install "${pins[@]}" >&2
"${pip[@]}" download -d "$dir.tmp/wheels" --only-binary=:all: "${wheel_pins[@]}" >&2
rm -rf "$dir"
mv "$dir.tmp" "$dir"
# A venv's scripts name its path: make it again where it now lives (the packages stay).
python3 -m venv --upgrade "$venv" >&2
"$venv/bin/python" -c 'import httpx, pytest, mypy, build, openai, gymnasium' >&2
# mypy's cache of the SDK's dependencies (the standard library, httpx, openai, gymnasium) with the
# SDK's own settings, so the packaging test checks only the package (seconds, not a minute).
(cd "$root/sdk/python" && "$venv/bin/python" -m mypy --cache-dir "$dir/mypy" -c 'import httpx, openai, gymnasium' >&2)
touch "$stamp"
echo "$venv/bin/python"
