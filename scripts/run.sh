#!/usr/bin/env bash
# make run: start the gateway on embedded defaults (process provider, embedded lease store in
# ./.quarry) in the foreground, and print how to use it once it answers. Ctrl-C stops the gateway;
# sandboxes keep running and are picked up again by the next `make run` (`make clean` stops them).
set -euo pipefail
cd "$(dirname "$0")/.."

export QUARRY_ADDR="${QUARRY_ADDR:-127.0.0.1:8080}"
export QUARRY_DATA_DIR="${QUARRY_DATA_DIR:-$PWD/.quarry}"
export QUARRY_PROVIDER="${QUARRY_PROVIDER:-process}"
QUARRY_GATEWAY_ID="$(scripts/gateway-id.sh)" # this checkout's: make clean removes its sandboxes only
export QUARRY_GATEWAY_ID
if [ "$QUARRY_PROVIDER" = docker ]; then
  # Docker sandboxes: an engine and the locally built images (no registry is needed).
  scripts/docker-up.sh
  scripts/images/build.sh
  if [ -z "${QUARRY_POOLS_FILE:-}" ]; then
    export QUARRY_POOLS_FILE="$PWD/scripts/images/pools.yaml"
    export QUARRY_ENVS_FILE="${QUARRY_ENVS_FILE:-$PWD/scripts/images/envs.yaml}"
  fi
fi
export QUARRY_POOLS_FILE="${QUARRY_POOLS_FILE:-$PWD/config/pools.yaml}"
export QUARRY_AGENT_BINARY="${QUARRY_AGENT_BINARY:-$PWD/bin/execagent}"
gateway_bin="${QUARRY_GATEWAY_BINARY:-$PWD/bin/gateway}" # the tests run their own build
mkdir -p "$QUARRY_DATA_DIR"
if [ -z "${QUARRY_ENVS_FILE:-}" ] && [ "$QUARRY_POOLS_FILE" = "$PWD/config/pools.yaml" ]; then
  # The example envs (examples/envs) on the default pool, with their paths on this machine.
  sed "s|@QUARRY_ROOT@|$PWD|g" config/envs.yaml >"$QUARRY_DATA_DIR/envs.yaml"
  export QUARRY_ENVS_FILE="$QUARRY_DATA_DIR/envs.yaml"
fi

scheme=http
[ -n "${QUARRY_TLS_CERT_FILE:-}" ] && scheme=https
url="$scheme://$QUARRY_ADDR"

# Something already answering on the address would pass the readiness check below for us.
if curl -sk -o /dev/null --max-time 2 "$url/healthz" 2>/dev/null; then
  echo "make run: something already listens on $QUARRY_ADDR (another gateway?); stop it or set QUARRY_ADDR" >&2
  exit 1
fi

"$gateway_bin" &
gw=$!
trap 'kill -TERM $gw 2>/dev/null; wait $gw 2>/dev/null' INT TERM

ready=""
for _ in $(seq 1 300); do
  if ! kill -0 $gw 2>/dev/null; then wait $gw; exit $?; fi
  if curl -fsk --max-time 2 "$url/healthz" >/dev/null 2>&1; then ready=1; break; fi
  sleep 0.1
done
if [ -z "$ready" ]; then
  echo "make run: the gateway did not answer on $url within 30s; stopping it" >&2
  kill -TERM $gw 2>/dev/null; wait $gw 2>/dev/null
  exit 1
fi

if [ -n "${QUARRY_API_KEYS:-}" ]; then key="${QUARRY_API_KEYS%%,*}"; else key="$(cat "$QUARRY_DATA_DIR/api-key")"; fi

# The banner says only what this gateway serves: it asks the gateway for its pools and envs.
get() { curl -fsk --max-time 5 -H "Authorization: Bearer $key" "$url$1" 2>/dev/null || true; }
names() { { grep -o "\"$1\":\"[^\"]*\"" || true; } | cut -d'"' -f4; }
pools="$(get /v1/pools | names name)"
envs="$(get /v1/envs | names id)"
pool=default
[ -z "$pools" ] || grep -qx default <<<"$pools" || pool="$(head -n 1 <<<"$pools")"
cli_pool=""
[ "$pool" = default ] || cli_pool=" --pool $pool"
auth='-H "Authorization: Bearer $QUARRY_API_KEY"'

cat <<MSG

  Quarry gateway: $url   (provider: $QUARRY_PROVIDER, lease store: embedded in $QUARRY_DATA_DIR, gateway id: $QUARRY_GATEWAY_ID)
  API key:        $key
  Web console:    $url/ui   (sign in with the API key; docs/CONSOLE.md)

  Try it (pools: $(echo $pools | sed 's/ /, /g')):
    export QUARRY_URL=$url QUARRY_API_KEY=$key
    curl -s $auth -d '{"pool":"$pool"}' \$QUARRY_URL/v1/sandboxes
    curl -s $auth -d '{"command":"uname -a"}' \$QUARRY_URL/v1/sandboxes/<id>/exec
  or with the CLI:
    ./bin/quarry sandbox create$cli_pool && ./bin/quarry sandbox ls
MSG
if [ -n "$envs" ]; then
  # A step of the guess game or the terminal task (the examples), else of the first env.
  env="$(head -n 1 <<<"$envs")" action='…'
  if grep -qx guess <<<"$envs"; then env=guess action=50; elif grep -qx terminal <<<"$envs"; then env=terminal action='"cat input.txt"'; fi
  cat <<MSG
  a Gym-style env (reset / step; envs $(echo $envs | sed 's/ /, /g') from \$QUARRY_ENVS_FILE, docs/ENVS.md):
    curl -s $auth -d '{"env_id":"$env"}' \$QUARRY_URL/v1/envs
    curl -s $auth -d '{"seed":42}' \$QUARRY_URL/v1/sandboxes/<id>/env/reset
    curl -s $auth -d '{"action":$action}' \$QUARRY_URL/v1/sandboxes/<id>/env/step
MSG
else
  echo "  (no Gym-style envs here: set QUARRY_ENVS_FILE to serve them; docs/ENVS.md)"
fi
cat <<MSG
  the model relay (docs/MODELSERVICE.md): an OpenAI client in any sandbox works as it is
  (OPENAI_BASE_URL and OPENAI_API_KEY are set); the trainer claims and answers its calls:
    curl -s $auth "\$QUARRY_URL/v1/model/requests?wait_ms=20000"

  Ctrl-C stops the gateway (sandboxes keep running; 'make clean' stops them).

MSG
wait $gw
