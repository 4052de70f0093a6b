#!/usr/bin/env bash
# A local AWS API emulator on 127.0.0.1:4566 (LocalStack's port) for machines where LocalStack's
# image cannot be pulled: moto's server (PyPI `moto[server]`) serves DynamoDB and ECS, run through
# localstack/moto_serial.py so that each request is atomic, as on AWS.
#
#   localstack/emulator.sh start    install moto in .cache/moto-venv (once), start it, wait until it answers
#   localstack/emulator.sh stop     stop the emulator started by this script
#   localstack/emulator.sh status   exit 0 when something answers on the endpoint
#
# Point the AWS SDK at it with AWS_ENDPOINT_URL=http://127.0.0.1:4566 (and fake credentials); the
# same tests run against LocalStack (docker-compose.yml here) or real AWS by changing that variable.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="$root/.cache"
venv="$cache/moto-venv"
pidfile="$cache/moto.pid"
logfile="$cache/moto.log"
host=127.0.0.1
port="${QUARRY_EMULATOR_PORT:-4566}"
moto_version=5.2.5

answers() { curl -s -o /dev/null -m 2 "http://$host:$port/moto-api/" || curl -s -o /dev/null -m 2 "http://$host:$port/"; }

start() {
  if answers; then echo "emulator: already answering on $host:$port"; return 0; fi
  mkdir -p "$cache"
  if [ ! -x "$venv/bin/moto_server" ]; then
    echo "emulator: installing moto[server]==$moto_version into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "moto[server]==$moto_version"
  fi
  echo "emulator: starting moto on $host:$port, one request at a time (log: $logfile)"
  # moto_serial.py: moto's own server is not atomic under concurrent requests (see the file).
  nohup "$venv/bin/python" "$root/localstack/moto_serial.py" "$host" "$port" >"$logfile" 2>&1 &
  echo $! >"$pidfile"
  for _ in $(seq 1 150); do
    if answers; then echo "emulator: ready"; return 0; fi
    if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      echo "emulator: moto_server exited; its log:" >&2; cat "$logfile" >&2; return 1
    fi
    sleep 0.2
  done
  echo "emulator: did not answer on $host:$port within 30 s" >&2
  return 1
}

stop() {
  if [ -f "$pidfile" ]; then
    pid="$(cat "$pidfile")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
    echo "emulator: stopped"
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) answers ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
