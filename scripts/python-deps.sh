#!/usr/bin/env bash
# Installs the Python packages that sandboxed test programs import (the official `openai` client,
# used by the model relay's end-to-end tests) into .cache/python-deps with `pip install --target`,
# once: a second run with the same pinned version does nothing. The directory works on the host
# (PYTHONPATH) and inside containers (mount or copy it; the host's Python and Debian's are 3.11).
#
#   scripts/python-deps.sh          install (idempotent) and print the directory
#
# make test calls it before the integration suites and sets QUARRY_TEST_PYTHONPATH to what it prints;
# the tests (internal/testenv.PythonPath) fail when the package does not import from there, and
# without the variable print SKIP (a failure under make test).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
target="$root/.cache/python-deps"
openai_version=3.51.0
stamp="$target/.installed-openai-$openai_version"

command -v python3 >/dev/null || { echo "python-deps: python3 is required" >&2; exit 1; }
if [ -f "$stamp" ] && PYTHONPATH="$target" python3 -c 'import openai' >/dev/null 2>&1; then
  echo "$target"
  exit 0
fi
echo "python-deps: installing openai==$openai_version into $target" >&2
rm -rf "$target.tmp"
python3 -m pip install -q --disable-pip-version-check --no-warn-conflicts --root-user-action=ignore --no-input --target "$target.tmp" "openai==$openai_version" >&2
rm -rf "$target"
mv "$target.tmp" "$target"
PYTHONPATH="$target" python3 -c 'import openai' >&2
touch "$stamp"
echo "$target"
