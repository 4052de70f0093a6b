#!/usr/bin/env bash
# Make a Docker engine reachable for the Docker provider's tests (make test) and for
# `QUARRY_PROVIDER=docker make run`. Idempotent and quick when an engine already answers:
#  1. if `docker info` answers, do nothing;
#  2. otherwise install Debian's docker.io when dockerd is missing (apt-get, as root);
#  3. start dockerd in the background (its own session, log in $QUARRY_DOCKERD_LOG) and wait,
#     bounded, until it answers on /var/run/docker.sock.
# Nothing here pulls an image: no registry is reachable on these machines (scripts/images/build.sh
# builds the test images locally). Exits non-zero, with the daemon's log tail, when the engine
# does not come up: a missing dependency is a failure, never a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh

log="${QUARRY_DOCKERD_LOG:-/var/log/quarry-dockerd.log}"
wait_s="${QUARRY_DOCKERD_WAIT:-60}"

engine_up() { timeout 10 docker info >/dev/null 2>&1; }

if engine_up; then
  exit 0
fi

ensure_apt docker.io test -x /usr/sbin/dockerd
# The client: docker.io ships one; an image may already have a newer one in PATH.
command -v docker >/dev/null || { echo "docker.io installed but no docker client in PATH" >&2; exit 1; }

pidfile=/var/run/docker.pid
if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  echo "== dockerd (pid $(cat "$pidfile")) runs but does not answer yet; waiting"
else
  echo "== starting dockerd (log: $log)"
  rm -f "$pidfile"
  # setsid: the daemon outlives this script and the shell that ran it. Its own containerd is
  # started by dockerd itself (no systemd on these machines). Without TMPDIR: a caller's may be a
  # run's own temp dir (make test's, when a Docker suite restarts the engine), removed when the run
  # ends, and runc keeps its exec state there: every `docker exec` after that run would fail.
  as_root env -u TMPDIR setsid /usr/sbin/dockerd --host unix:///var/run/docker.sock >>"$log" 2>&1 </dev/null &
fi

for _ in $(seq 1 $((wait_s * 5))); do
  if engine_up; then
    echo "== dockerd is up: $(docker version --format 'server {{.Server.Version}}, API {{.Server.APIVersion}}' 2>/dev/null)"
    exit 0
  fi
  sleep 0.2
done
echo "dockerd did not answer within ${wait_s}s; last lines of $log:" >&2
tail -n 30 "$log" >&2 || true
exit 1
