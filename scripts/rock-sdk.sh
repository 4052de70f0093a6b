#!/usr/bin/env bash
# Installs ROCK's Python SDK (rl-rock, pinned) into a venv under .cache/, for
# the ROCK compatibility tests (tests/rock_*_test.go, docs/ROCK.md).
# Idempotent: a venv that already has the pinned version is left alone.
# Prints the venv's python on stdout.
#   ROCK_SDK_VERSION  rl-rock version (default 1.11.0)
#   ROCK_SDK_VENV     venv directory (default .cache/rock-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh

# What the drivers use.
pinned_venv "${ROCK_SDK_VENV:-.cache/rock-venv}" rl-rock "${ROCK_SDK_VERSION:-1.11.0}" rock.sdk.sandbox.client rock.sdk.envs
