#!/usr/bin/env bash
# What test runs left running on this machine, one line each, naming it and why it counts:
#   - exec agents (of this mount namespace: a container's agent is its container's) whose working
#     directory, owner directory (QUARRY_AGENT_OWNER_DIR) or binary is gone, or that run from or in
#     the run's temp dir (--tmp);
#   - gateways (a process named gateway with QUARRY_DATA_DIR in its environment) whose binary,
#     working directory or data dir is gone, or that run from or in --tmp;
#   - Docker containers, networks and volumes (copy-on-write layers and the overlays of sandboxes
#     started on them) labelled with a test gateway id (quarry.gateway e2e-<hex>: tests/,
#     test-<hex>: providers/docker), unless a gateway of that id still runs;
#   - with --moto-pid PID: the AWS emulator the run started, if it still runs after its stop;
#   - image registries that this checkout's scripts/registry.sh started (docker-registry processes
#     whose QUARRY_REGISTRY_DIR is this checkout's .cache/registry): the run stops those it
#     started before this check, so one that still runs and started since --since was left.
# With --since EPOCH, what started before EPOCH is listed as left by an earlier run and does not
# count; the rest (or, without --since, everything) makes the exit status 1. --wait SECONDS
# re-checks for up to that long while something counts (agents exit by themselves within 5 s of
# their directory's removal). It only reports: it stops nothing.
#
#   scripts/leftovers.sh [--since EPOCH] [--tmp DIR] [--moto-pid PID] [--wait SECONDS]
set -uo pipefail

since=0 tmp="" moto_pid="" wait_s=0
while [ $# -gt 0 ]; do
  case "$1" in
    --since) since="$2"; shift 2 ;;
    --tmp) tmp="${2%/}"; shift 2 ;;
    --moto-pid) moto_pid="$2"; shift 2 ;;
    --wait) wait_s="$2"; shift 2 ;;
    *) echo "usage: $0 [--since EPOCH] [--tmp DIR] [--moto-pid PID] [--wait SECONDS]" >&2; exit 2 ;;
  esac
done

test_gateway_id='^(e2e|test)-[0-9a-f]{6,}$'
my_mnt="$(readlink /proc/self/ns/mnt)"

found=()   # "epoch<TAB>description" of everything found
in_tmp() { [ -n "$tmp" ] && case "$1" in "$tmp"/*) return 0 ;; esac; return 1; }
add() { found+=("$1	$2"); }

scan_processes() {
  local now pid exe base cwd env reasons started dir id
  now="$(date +%s)"
  running_ids=" "
  for d in /proc/[0-9]*; do
    pid="${d#/proc/}"
    exe="$(readlink "$d/exe" 2>/dev/null)" || continue
    base="$(basename "${exe% (deleted)}")"
    case "$base" in execagent | gateway) ;; *) continue ;; esac
    [ "$(readlink "$d/ns/mnt" 2>/dev/null)" = "$my_mnt" ] || continue
    cwd="$(readlink "$d/cwd" 2>/dev/null)" || continue
    env="$(tr '\0' '\n' 2>/dev/null <"$d/environ")" || continue
    reasons=()
    case "$exe" in *" (deleted)") reasons+=("its binary ${exe% (deleted)} is gone") ;; esac
    case "$cwd" in *" (deleted)") reasons+=("its working directory ${cwd% (deleted)} is gone") ;; esac
    if in_tmp "${exe% (deleted)}" || in_tmp "${cwd% (deleted)}"; then reasons+=("it runs from or in the run's temp dir $tmp"); fi
    if [ "$base" = execagent ]; then
      dir="$(sed -n 's/^QUARRY_AGENT_OWNER_DIR=//p' <<<"$env" | head -n 1)"
      if [ -n "$dir" ] && [ ! -d "$dir" ]; then reasons+=("its owner directory $dir is gone"); fi
    else
      dir="$(sed -n 's/^QUARRY_DATA_DIR=//p' <<<"$env" | head -n 1)"
      [ -n "$dir" ] || continue # not a Quarry gateway
      case "$dir" in /*) ;; *) dir="${cwd% (deleted)}/$dir" ;; esac
      id="$(sed -n 's/^QUARRY_GATEWAY_ID=//p' <<<"$env" | head -n 1)"
      [ -n "$id" ] && running_ids+="$id "
      if [ ! -d "$dir" ]; then reasons+=("its data dir $dir is gone"); fi
      if in_tmp "$dir"; then reasons+=("its data dir is in the run's temp dir"); fi
    fi
    [ ${#reasons[@]} -gt 0 ] || continue
    started=$((now - $(ps -o etimes= -p "$pid" 2>/dev/null || echo 0)))
    add "$started" "$base pid $pid (${exe% (deleted)}, cwd ${cwd% (deleted)}): $(printf '%s; ' "${reasons[@]}" | sed 's/; $//')"
  done
}

scan_docker() {
  command -v docker >/dev/null 2>&1 && timeout 10 docker info >/dev/null 2>&1 || return 0
  local id gw name state created
  while IFS=$'\t' read -r id gw name state created; do
    [[ "$gw" =~ $test_gateway_id ]] || continue
    case "$running_ids" in *" $gw "*) continue ;; esac # its gateway still runs
    add "$(date -d "$created" +%s 2>/dev/null || echo 0)" "container $id $name ($state) of test gateway $gw"
  done < <(docker ps -aq --filter label=quarry.gateway | xargs -r docker inspect \
    --format '{{.ID}}{{"\t"}}{{index .Config.Labels "quarry.gateway"}}{{"\t"}}{{.Name}}{{"\t"}}{{.State.Status}}{{"\t"}}{{.Created}}' 2>/dev/null)
  while IFS=$'\t' read -r id gw name created; do
    [[ "$gw" =~ $test_gateway_id ]] || continue
    case "$running_ids" in *" $gw "*) continue ;; esac
    add "$(date -d "$created" +%s 2>/dev/null || echo 0)" "network $name ($id) of test gateway $gw"
  done < <(docker network ls -q --filter label=quarry.managed=true | xargs -r docker network inspect \
    --format '{{.ID}}{{"\t"}}{{index .Labels "quarry.gateway"}}{{"\t"}}{{.Name}}{{"\t"}}{{.Created}}' 2>/dev/null)
  while IFS=$'\t' read -r name gw role created; do
    [[ "$gw" =~ $test_gateway_id ]] || continue
    case "$running_ids" in *" $gw "*) continue ;; esac
    add "$(date -d "$created" +%s 2>/dev/null || echo 0)" "volume $name (${role:-no role}) of test gateway $gw"
  done < <(docker volume ls -q --filter label=quarry.gateway | xargs -r docker volume inspect \
    --format '{{.Name}}{{"\t"}}{{index .Labels "quarry.gateway"}}{{"\t"}}{{index .Labels "quarry.docker.volume"}}{{"\t"}}{{.CreatedAt}}' 2>/dev/null)
}

registry_dir="${QUARRY_REGISTRY_DIR:-$(cd "$(dirname "$0")/.." && pwd)/.cache/registry}"
scan_registry() {
  local d pid exe now started
  now="$(date +%s)"
  for d in /proc/[0-9]*; do
    pid="${d#/proc/}"
    exe="$(readlink "$d/exe" 2>/dev/null)" || continue
    [ "$(basename "${exe% (deleted)}")" = docker-registry ] || continue
    tr '\0' '\n' 2>/dev/null <"$d/environ" | grep -qxF "QUARRY_REGISTRY_DIR=$registry_dir" || continue
    started=$((now - $(ps -o etimes= -p "$pid" 2>/dev/null || echo 0)))
    add "$started" "docker-registry pid $pid ($(tr '\0' ' ' 2>/dev/null <"$d/cmdline")), started by scripts/registry.sh"
  done
}

scan_moto() {
  [ -n "$moto_pid" ] || return 0
  if tr '\0' ' ' 2>/dev/null <"/proc/$moto_pid/cmdline" | grep -q moto; then
    add "$(date +%s)" "the AWS emulator this run started (pid $moto_pid) still runs after its stop"
  fi
}

scan() {
  found=()
  scan_processes
  scan_docker
  scan_moto
  scan_registry
  counted=0
  for f in "${found[@]}"; do [ "${f%%	*}" -ge "$since" ] && counted=$((counted + 1)); done
}

scan
for _ in $(seq 1 "$wait_s"); do
  [ "$counted" -gt 0 ] || break
  sleep 1
  scan
done

older=0
for f in "${found[@]}"; do
  at="${f%%	*}" what="${f#*	}"
  when="$(date -u -d "@$at" '+%Y-%m-%d %H:%M:%S UTC' 2>/dev/null || echo "?")"
  if [ "$at" -ge "$since" ]; then
    echo "leftover: $what (started $when)"
  else
    echo "left by an earlier run: $what (started $when)"
    older=$((older + 1))
  fi
done
[ "$older" -eq 0 ] || echo "leftovers: $older from earlier runs (not counted)"
if [ "$counted" -gt 0 ]; then
  echo "leftovers: $counted processes, containers, networks or registries left running (see above)" >&2
  exit 1
fi
echo "leftovers: none"
