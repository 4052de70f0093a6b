#!/usr/bin/env bash
# Helpers for scripts/test.sh and scripts/bench.sh: install what the suites need, idempotently.
# Source it; every function fails loudly (a missing dependency is a failure, never a skip).

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "need root to run: $*" >&2; return 1; fi
}

apt_updated=""
# ensure_apt PKG CHECK...: install Debian package PKG unless the command CHECK succeeds.
ensure_apt() {
  local pkg="$1"; shift
  if "$@" >/dev/null 2>&1; then return 0; fi
  echo "== installing $pkg (apt-get)"
  if [ -z "$apt_updated" ]; then as_root apt-get update -qq; apt_updated=1; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null
  "$@" >/dev/null 2>&1 || { echo "$pkg installed but '$*' still fails" >&2; return 1; }
}
