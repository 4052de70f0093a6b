#!/usr/bin/env bash
# Stop every process-provider sandbox left running under $QUARRY_DATA_DIR (default ./.quarry):
# sandboxes outlive the gateway by design, so `make clean` uses this to stop them.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${QUARRY_DATA_DIR:-$PWD/.quarry}"
shopt -s nullglob
for f in "$dir"/process/*/task.json; do
  pid="$(sed -n 's/^ *"pid": *\([0-9][0-9]*\).*/\1/p' "$f" | head -n 1)"
  if [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q execagent; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    pkill -KILL -s "$pid" 2>/dev/null || true # the agent is its session's leader: this takes every sandbox process
  fi
  chmod -R u+w "$(dirname "$f")" 2>/dev/null || true
  rm -rf "$(dirname "$f")"
  echo "stopped $(basename "$(dirname "$f")")"
done

# Docker sandboxes of this checkout's gateway id (`QUARRY_PROVIDER=docker make run`; the id is
# derived from the checkout's path, so other checkouts' and users' sandboxes are left alone).
if command -v docker >/dev/null && timeout 10 docker info >/dev/null 2>&1; then
  gateway_id="$(scripts/gateway-id.sh)"
  ids="$(docker ps -aq --filter label=quarry.managed=true --filter "label=quarry.gateway=$gateway_id")"
  if [ -n "$ids" ]; then
    # shellcheck disable=SC2086 # one id per word
    docker rm -f $ids >/dev/null
    echo "removed $(echo "$ids" | wc -w) docker sandboxes of gateway $gateway_id"
  fi
  # Then the containers that hold copy-on-write layers in memory, and the volumes (layers, and the
  # overlays of sandboxes that ran on them), which no container of the gateway mounts any more.
  ids="$(docker ps -aq --filter label=quarry.docker.volume --filter "label=quarry.gateway=$gateway_id")"
  if [ -n "$ids" ]; then
    # shellcheck disable=SC2086 # one id per word
    docker rm -f $ids >/dev/null
    echo "removed $(echo "$ids" | wc -w) copy-on-write layer holders of gateway $gateway_id"
  fi
  vols="$(docker volume ls -q --filter "label=quarry.gateway=$gateway_id")"
  if [ -n "$vols" ]; then
    # shellcheck disable=SC2086 # one name per word
    docker volume rm -f $vols >/dev/null
    echo "removed $(echo "$vols" | wc -w) docker volumes (copy-on-write layers and overlays) of gateway $gateway_id"
  fi
fi
