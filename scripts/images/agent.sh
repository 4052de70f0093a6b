#!/usr/bin/env bash
# Build the ECS provider's agent image locally, idempotently:
#
#   quarry/agent:latest   static busybox at /bin/busybox with only its cp applet (/bin/cp), and the
#                         static exec agent at /execagent (mode 0755): what the task definition's
#                         init container runs (`cp /execagent /.quarry/execagent`)
#
# Like scripts/images/build.sh, the root file system is assembled in a temporary directory and
# loaded with `docker import` (no Dockerfile, no builder, no registry). bin/execagent is rebuilt
# (static, the Makefile's flags) when it is missing or differs from what the current source
# builds. The image carries the label quarry.inputs, a hash of what went into it; the build is
# skipped when the label matches, so a second run takes a few seconds (the Go build cache).
# To deploy it: docker tag quarry/agent:latest <ECR repository>:<tag> && docker push ...
# Usage: scripts/images/agent.sh [--force]
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/deps.sh

force=""
[ "${1:-}" = "--force" ] && force=1
version=1 # bump when the layout below changes
image="${QUARRY_AGENT_IMAGE_TAG:-quarry/agent:latest}"
busybox=/bin/busybox
agent=bin/execagent

ensure_apt busybox-static test -x "$busybox"
timeout 10 docker info >/dev/null 2>&1 || { echo "no Docker engine answers: run scripts/docker-up.sh first" >&2; exit 1; }
# Both binaries must be static: the image has no libc.
if ldd "$busybox" >/dev/null 2>&1; then echo "$busybox is not static (install busybox-static)" >&2; exit 1; fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# The agent: build it where the current source says, replace bin/execagent only when it differs.
mkdir -p bin
CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$tmp/execagent" ./cmd/execagent
if ldd "$tmp/execagent" >/dev/null 2>&1; then echo "the built exec agent is not static" >&2; exit 1; fi
if [ ! -x "$agent" ] || ! cmp -s "$tmp/execagent" "$agent"; then
  mv "$tmp/execagent" "$agent"
  echo "== rebuilt $agent"
fi

want="$( { echo "version=$version"; sha256sum "$busybox" "$agent" "$0"; } | sha256sum | cut -c1-32)"
have="$(docker image inspect --format '{{ index .Config.Labels "quarry.inputs" }}' "$image" 2>/dev/null || true)"
if [ -z "$force" ] && [ "$have" = "$want" ]; then
  echo "== $image is up to date"
  exit 0
fi

root="$tmp/root"
mkdir -p "$root/bin"
cp "$busybox" "$root/bin/busybox"
ln -s busybox "$root/bin/cp"
install -m 0755 "$agent" "$root/execagent"
# PATH is set in the image: the init container's entry point is a bare "cp".
tar --numeric-owner --owner=0 --group=0 -C "$root" -c . |
  docker import --change "LABEL quarry.inputs=$want" --change "ENV PATH=/bin" - "$image" >/dev/null
echo "== built $image"
