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
cat <<MSG

  Quarry gateway: $url   (provider: $QUARRY_PROVIDER, lease store: embedded in $QUARRY_DATA_DIR, gateway id: $QUARRY_GATEWAY_ID)
  API key:        $key
  Web console:    $url/ui   (sign in with the API key; docs/CONSOLE.md)

  Try it:
    export QUARRY_URL=$url QUARRY_API_KEY=$key
    curl -s -H "Authorization: Bearer \$QUARRY_API_KEY" -d '{"pool":"default"}' \$QUARRY_URL/v1/sandboxes
    curl -s -H "Authorization: Bearer \$QUARRY_API_KEY" -d '{"command":"uname -a"}' \$QUARRY_URL/v1/sandboxes/<id>/exec
  or with the CLI:
    ./bin/quarry sandbox create && ./bin/quarry sandbox ls
  a Gym-style env (reset / step; envs in \$QUARRY_ENVS_FILE, docs/ENVS.md):
    curl -s -H "Authorization: Bearer \$QUARRY_API_KEY" -d '{"env_id":"guess"}' \$QUARRY_URL/v1/envs
    curl -s -H "Authorization: Bearer \$QUARRY_API_KEY" -d '{"seed":42}' \$QUARRY_URL/v1/sandboxes/<id>/env/reset
    curl -s -H "Authorization: Bearer \$QUARRY_API_KEY" -d '{"action":50}' \$QUARRY_URL/v1/sandboxes/<id>/env/step
  the model relay (docs/MODELSERVICE.md): an OpenAI client in any sandbox works as it is
  (OPENAI_BASE_URL and OPENAI_API_KEY are set); the trainer claims and answers its calls:
    curl -s -H "Authorization: Bearer \$QUARRY_API_KEY" "\$QUARRY_URL/v1/model/requests?wait_ms=20000"

  Ctrl-C stops the gateway (sandboxes keep running; 'make clean' stops them).

MSG
wait $gw
