#!/usr/bin/env bash
# Installs the Python packages that sandboxed test programs import into .cache/python-deps with
# `pip install --target`, once: a second run with the same pinned versions does nothing. They are
# the official `openai` client (the model relay's end-to-end tests) and ROCK's SDK rl-rock with
# what its in-sandbox model service runs on (fastapi, uvicorn, psutil: the packages of its
# model-service extra that the local service imports), for ROCK's ModelService in a sandbox
# (tests/rock_model_test.go, docs/ROCK.md). The directory works on the host (PYTHONPATH) and inside
# containers (mount or copy it; the host's Python and Debian's are 3.11).
#
#   scripts/python-deps.sh          install (idempotent) and print the directory
#
# make test calls it before the integration suites and sets QUARRY_TEST_PYTHONPATH to what it prints;
# the tests (internal/testenv.PythonPath) fail when the package does not import from there, and
# without the variable print SKIP (a failure under make test).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
target="$root/.cache/python-deps"
packages=(openai==3.51.0 rl-rock==1.11.0 fastapi==0.165.0 uvicorn==0.55.0 psutil==7.2.2)
stamp="$target/.installed-$(echo "${packages[*]}" | sha256sum | cut -c1-16)"
imports='import openai, rock.cli.main, rock.sdk.model.server.main'

command -v python3 >/dev/null || { echo "python-deps: python3 is required" >&2; exit 1; }
if [ -f "$stamp" ] && PYTHONPATH="$target" python3 -c "$imports" >/dev/null 2>&1; then
  echo "$target"
  exit 0
fi
echo "python-deps: installing ${packages[*]} into $target" >&2
rm -rf "$target.tmp"
python3 -m pip install -q --disable-pip-version-check --no-warn-conflicts --root-user-action=ignore --no-input --target "$target.tmp" "${packages[@]}" >&2
rm -rf "$target"
mv "$target.tmp" "$target"
PYTHONPATH="$target" python3 -c "$imports" >&2
touch "$stamp"
echo "$target"
