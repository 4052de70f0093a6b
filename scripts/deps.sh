#!/usr/bin/env bash
# Helpers for scripts/test.sh, scripts/bench.sh and the image scripts: install what the suites need,
# idempotently, and find the host's Debian archive.
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

# apt_mirror SUITE [DIR]: the Debian archive that the host's apt sources name, for debootstrap. It
# reads only apt's own files under DIR (default /etc/apt): sources.list and sources.list.d/*.list
# (one-line format, "deb [options] URI SUITE COMPONENT…") and sources.list.d/*.sources (deb822:
# Types, URIs, Suites, Enabled), in apt's order. It prints the URI (http, https, ftp or file) of the
# first enabled "deb" entry that lists SUITE, else of the first whose path ends in /debian; with
# neither it fails, saying what to add.
apt_mirror() {
  local suite="$1" dir="${2:-/etc/apt}" f uri suites s
  local files=()
  [ -f "$dir/sources.list" ] && files+=("$dir/sources.list")
  for f in "$dir"/sources.list.d/*; do
    case "$f" in *.list|*.sources) [ -f "$f" ] && files+=("$f") ;; esac
  done
  local entries=""
  if [ "${#files[@]}" -gt 0 ]; then
    entries="$(awk '
      function trim(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
      function flush(   i, n, t, u, deb) {
        if (fmt == "deb822" && have) {
          deb = 0; n = split(f["types"], t, /[ \t]+/)
          for (i = 1; i <= n; i++) if (t[i] == "deb") deb = 1
          if (deb && tolower(f["enabled"]) != "no") {
            n = split(f["uris"], u, /[ \t]+/)
            for (i = 1; i <= n; i++) if (u[i] != "") print u[i] "\t" f["suites"]
          }
        }
        split("", f); have = 0; last = ""
      }
      FNR == 1 { flush(); fmt = FILENAME ~ /\.sources$/ ? "deb822" : "oneline" }
      fmt == "oneline" {
        sub(/#.*/, "")
        if ($1 != "deb") next
        line = $0; sub(/^[ \t]*deb[ \t]+/, "", line); sub(/^\[[^]]*\][ \t]*/, "", line)
        n = split(line, w, /[ \t]+/); if (n >= 2) print w[1] "\t" w[2]
        next
      }
      /^[ \t]*#/ { next }
      /^[ \t]*$/ { flush(); next }
      /^[ \t]/ { if (last != "") f[last] = f[last] " " trim($0); next }
      { k = tolower(trim(substr($0, 1, index($0, ":") - 1))); f[k] = trim(substr($0, index($0, ":") + 1)); last = k; have = 1 }
      END { flush() }
    ' "${files[@]}")"
  fi
  local pass
  for pass in suite path; do
    while IFS=$'\t' read -r uri suites; do
      uri="${uri%/}"
      case "$uri" in http://*|https://*|ftp://*|file:/*) ;; *) continue ;; esac
      if [ "$pass" = suite ]; then
        for s in $suites; do [ "$s" = "$suite" ] && { echo "$uri"; return 0; }; done
      else
        case "$uri" in */debian) echo "$uri"; return 0 ;; esac
      fi
    done <<<"$entries"
  done
  echo "no Debian archive in the host's apt sources ($dir/sources.list, $dir/sources.list.d/*.list," \
    "*.sources): add one for suite $suite, e.g. a line 'deb URI $suite main' in" \
    "$dir/sources.list.d/debian.list, where URI is the mirror this host may use" >&2
  return 1
}

# pinned_venv VENV DIST VERSION IMPORT…: a venv at VENV with DIST==VERSION from the package index,
# made (again) unless it already has that version and imports every IMPORT (module names, or
# "from m import a, b" statements). Prints its python's absolute path; pip's output goes to stderr.
pinned_venv() {
  local venv="$1" dist="$2" version="$3"; shift 3
  local py="$venv/bin/python" imports
  imports="$(printf '%s\n' "$@" | sed -E '/^from /!s/^/import /')"
  pinned_venv_ok() {
    [ -x "$py" ] && "$py" - "$dist" "$version" "$imports" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version(sys.argv[1]) == sys.argv[2]
exec(sys.argv[3])
PY
  }
  if ! pinned_venv_ok; then
    echo "installing $dist==$version into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$py" -m pip install --quiet --disable-pip-version-check "$dist==$version" >&2
    pinned_venv_ok || { echo "$dist==$version installed into $venv but does not import: $*" >&2; return 1; }
  fi
  echo "$(cd "$venv" && pwd)/bin/python" # absolute: the tests run in other directories
}
