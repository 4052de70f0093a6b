#!/usr/bin/env bash
# Two local image registries for the Docker provider's pull tests (Debian's docker-registry, the
# distribution registry 2.8), both on 127.0.0.1 only, each with its own config file and storage
# under .cache/registry (QUARRY_REGISTRY_DIR), the storage emptied at each start:
#   - open:  127.0.0.1:$QUARRY_REGISTRY_PORT (default 5055), no authentication;
#   - auth:  127.0.0.1:$QUARRY_REGISTRY_AUTH_PORT (default 5056), htpasswd (bcrypt, made here
#            offline with htpasswd from apache2-utils) basic auth of one user, quarry:quarry-test-only
#            (a test registry on loopback: a fixed password lets every checkout's tests use the
#            registries another one started, as with the AWS emulator); without it, 401.
#
#   scripts/registry.sh start    install docker-registry (once), start both, wait until they answer
#   scripts/registry.sh stop     stop the registries this checkout's script started (their processes
#                                carry QUARRY_REGISTRY_DIR, by which scripts/leftovers.sh finds them)
#   scripts/registry.sh status   exit 0 when both answer
#   scripts/registry.sh env      print the variables the tests read (after start):
#                                QUARRY_TEST_REGISTRY, QUARRY_TEST_REGISTRY_AUTH, QUARRY_TEST_REGISTRY_USER
#
# Docker 20.10 treats registries on 127.0.0.0/8 as insecure (plain HTTP) by default, so the engine
# pulls and pushes here without TLS or daemon settings. Idempotent: start with both answering does
# nothing; stop without a pid file does nothing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
source "$root/scripts/deps.sh"
dir="${QUARRY_REGISTRY_DIR:-$root/.cache/registry}"
host=127.0.0.1
port="${QUARRY_REGISTRY_PORT:-5055}"
auth_port="${QUARRY_REGISTRY_AUTH_PORT:-5056}"
user=quarry
password=quarry-test-only

# answers PORT [STATUS]: the registry's /v2/ answers (with STATUS when given: 200 open, 401 auth).
answers() {
  local code
  code="$(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://$host:$1/v2/")" || return 1
  [ -n "${2:-}" ] && [ "$code" != "$2" ] && return 1
  [ "$code" != 000 ]
}
up() { answers "$port" 200 && answers "$auth_port" 401; }

# config NAME PORT [HTPASSWD]: write instance NAME's config file and empty its storage.
config() {
  local name="$1" p="$2" htpasswd="${3:-}" d="$dir/$1"
  rm -rf "$d/storage"
  mkdir -p "$d/storage"
  {
    echo "version: 0.1"
    echo "log: {level: warn, accesslog: {disabled: true}, fields: {service: quarry-test-registry-$name}}"
    echo "storage:"
    echo "  filesystem: {rootdirectory: $d/storage}"
    echo "  delete: {enabled: true}"
    echo "  maintenance: {uploadpurging: {enabled: false}}"
    echo "http:"
    echo "  addr: $host:$p"
    echo "  secret: $(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    if [ -n "$htpasswd" ]; then
      echo "auth:"
      echo "  htpasswd: {realm: quarry-test, path: $htpasswd}"
    fi
  } >"$d/config.yml"
}

# run NAME PORT: start instance NAME in the background (its own session), pid in NAME/pid.
run() {
  local name="$1" p="$2" d="$dir/$1"
  if answers "$p"; then echo "registry: something already answers on $host:$p" >&2; return 1; fi
  QUARRY_REGISTRY_DIR="$dir" setsid /usr/bin/docker-registry serve "$d/config.yml" >"$d/log" 2>&1 </dev/null &
  echo $! >"$d/pid"
}

# wait_up NAME PORT STATUS
wait_up() {
  local name="$1" p="$2" status="$3" d="$dir/$1"
  for _ in $(seq 1 150); do
    if answers "$p" "$status"; then return 0; fi
    if ! kill -0 "$(cat "$d/pid")" 2>/dev/null; then
      echo "registry: $name exited; its log:" >&2; cat "$d/log" >&2; return 1
    fi
    sleep 0.2
  done
  echo "registry: $name did not answer on $host:$p within 30 s; its log:" >&2
  cat "$d/log" >&2
  return 1
}

start() {
  if up; then echo "registry: already answering on $host:$port and $host:$auth_port"; return 0; fi
  stop >/dev/null
  ensure_apt docker-registry test -x /usr/bin/docker-registry
  ensure_apt apache2-utils command -v htpasswd
  ensure_apt curl command -v curl
  # The package's own service (all interfaces, :5000) is not ours; keep it from running.
  if [ -x /etc/init.d/docker-registry ] && /etc/init.d/docker-registry status >/dev/null 2>&1; then
    as_root /etc/init.d/docker-registry stop >/dev/null 2>&1 || true
  fi
  mkdir -p "$dir/auth"
  htpasswd -Bbn "$user" "$password" >"$dir/auth/htpasswd" 2>/dev/null
  config open "$port"
  config auth "$auth_port" "$dir/auth/htpasswd"
  echo "registry: starting on $host:$port (open) and $host:$auth_port (htpasswd), state in $dir"
  run open "$port"
  run auth "$auth_port"
  wait_up open "$port" 200
  wait_up auth "$auth_port" 401
  echo "registry: ready"
}

stop() {
  local name pid
  for name in open auth; do
    [ -f "$dir/$name/pid" ] || continue
    pid="$(cat "$dir/$name/pid")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$dir/$name/pid"
    echo "registry: stopped $name (pid $pid)"
  done
}

env_vars() {
  echo "QUARRY_TEST_REGISTRY=$host:$port"
  echo "QUARRY_TEST_REGISTRY_AUTH=$host:$auth_port"
  echo "QUARRY_TEST_REGISTRY_USER=$user:$password"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) up ;;
  env) env_vars ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
