#!/usr/bin/env bash
# Build the Docker provider's test images locally (no registry is reachable here), idempotently:
# an image whose inputs did not change is left alone, so a second run takes well under a second.
#
#   quarry-test/busybox   static busybox only: /bin/sh is busybox, there is no bash
#   quarry-test/bash      busybox + /bin/bash and the shared libraries `ldd /bin/bash` lists
#   quarry-test/nosh      no /bin/sh and no bash at all (a launch of it must fail fast)
#   quarry-test/python    Debian bookworm with python3 and the openai package: built last, by
#                         scripts/images/python.sh (debootstrap, cached under .cache/images)
#
# Each image is a root file system assembled in a temporary directory from the host's files and
# loaded with `docker import` (no Dockerfile, no builder): busybox comes from Debian's
# busybox-static, bash from the host. Every image carries the label quarry-test.inputs, a
# hash of what went into it; the build is skipped when the label matches.
# Usage: scripts/images/build.sh [--force]
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/deps.sh

force=""
[ "${1:-}" = "--force" ] && force=1
version=1 # bump when the layout below changes
busybox=/bin/busybox
bash_bin=/bin/bash

ensure_apt busybox-static test -x "$busybox"
timeout 10 docker info >/dev/null 2>&1 || { echo "no Docker engine answers: run scripts/docker-up.sh first" >&2; exit 1; }
# busybox-static is static: a dynamic busybox would not run in a scratch image.
if ldd "$busybox" >/dev/null 2>&1; then echo "$busybox is not static (install busybox-static)" >&2; exit 1; fi

# bash_libs prints the absolute paths of the libraries bash loads (and its ELF interpreter).
bash_libs() { ldd "$bash_bin" | awk '/=> \//{print $3} /^[ \t]*\/.*\(0x/{print $1}' | sort -u; }

inputs_hash() { # NAME: a hash of every input of image NAME
  { echo "version=$version name=$1"; sha256sum "$busybox" "$0"
    if [ "$1" = bash ]; then sha256sum "$bash_bin" $(bash_libs | xargs -r readlink -f); fi
  } | sha256sum | cut -c1-32
}

# base_tree DIR: busybox with its applets as symlinks in /bin, a minimal /etc and /tmp.
base_tree() {
  local d="$1"
  mkdir -p "$d/bin" "$d/etc" "$d/tmp"
  chmod 1777 "$d/tmp"
  cp "$busybox" "$d/bin/busybox"
  for applet in $("$busybox" --list); do
    [ -e "$d/bin/$applet" ] || ln -s busybox "$d/bin/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n' >"$d/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$d/etc/group"
}

build_tree() { # NAME DIR
  local name="$1" d="$2"
  case "$name" in
    busybox) base_tree "$d" ;;
    bash)
      base_tree "$d"
      rm -f "$d/bin/bash" # busybox has no bash applet, but be sure
      cp "$bash_bin" "$d/bin/bash"
      for lib in $(bash_libs); do
        mkdir -p "$d$(dirname "$lib")"
        cp -L "$lib" "$d$lib"
      done
      ;;
    nosh)
      # Something to run, but no shell where the agent looks for one.
      mkdir -p "$d/opt" "$d/etc"
      cp "$busybox" "$d/opt/busybox"
      printf 'root:x:0:0:root:/root:/opt/nologin\n' >"$d/etc/passwd"
      ;;
    *) echo "unknown image $name" >&2; return 1 ;;
  esac
}

for name in busybox bash nosh; do
  image="quarry-test/$name:latest"
  want="$(inputs_hash "$name")"
  have="$(docker image inspect --format '{{ index .Config.Labels "quarry-test.inputs" }}' "$image" 2>/dev/null || true)"
  if [ -z "$force" ] && [ "$have" = "$want" ]; then
    echo "== $image is up to date"
    continue
  fi
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  build_tree "$name" "$tmp/root"
  tar --numeric-owner --owner=0 --group=0 -C "$tmp/root" -c . |
    docker import --change "LABEL quarry-test.inputs=$want" - "$image" >/dev/null
  rm -rf "$tmp"
  trap - EXIT
  echo "== built $image"
done

# A real Debian userland with python3 and the openai package (the model relay's Docker test).
scripts/images/python.sh ${force:+--force}

# The ECS provider's agent image (quarry/agent): busybox's cp and the static exec agent.
scripts/images/agent.sh ${force:+--force}
