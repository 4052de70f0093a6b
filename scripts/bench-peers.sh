#!/usr/bin/env bash
# Side-by-side session round trips of Quarry's exec agent and the agents peers use
# (SWE-ReX's swerex-remote, ROCK's rocklet). See bench/peers/README.md.
#
#   scripts/bench-peers.sh AGENT_BINARY [peers.py options: --json OUT --calls N ...]
#
# Setup is idempotent: the peers are installed once into .cache/peers-venv (gitignored) and
# reinstalled only when the pins below change. If the install fails, the run goes on and the
# peers are reported as not run with the reason. Exit 1 when Quarry's agent fails (or no usable
# Python is found);
# exit 2 on a usage error.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd) # paths given as arguments stay relative to the caller's directory

# The versions verified with bench/peers/peers.py. rl-rock's "rocklet" extra is what its
# rocklet server needs at run time (pexpect, bashlex, psutil, fastapi, uvicorn, ...).
PEER_PINS=(swe-rex==1.4.0 "rl-rock[rocklet]==1.11.0")
VENV=$root/.cache/peers-venv
SETUP_LOG=$root/.cache/peers-setup.log
PYTHON=${PYTHON:-python3}
PIP_TIMEOUT_S=900

if [[ $# -lt 1 || $1 == -* ]]; then
	echo "usage: $0 AGENT_BINARY [--json OUT] [--calls N] [--warmup N] [--max-seconds S] [--agents quarry,swe-rex,rocklet]" >&2
	exit 2
fi
agent=$1
shift
if [[ ! -x $agent ]]; then
	echo "bench-peers: quarry agent $agent: not an executable file (build it: CGO_ENABLED=0 go build -o $agent ./cmd/execagent)" >&2
	exit 1
fi

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 9))' >/dev/null 2>&1; then
	echo "bench-peers: $PYTHON does not run or is older than 3.9; set PYTHON to a Python >= 3.10" >&2
	exit 1
fi

# setup_peers installs the pinned peers into $VENV unless the stamp says they already are.
# It prints nothing on success and the reason on failure (the harness reports it).
setup_peers() {
	local stamp=$VENV/.quarry-pins want
	want=$("$PYTHON" -c 'import sys; print(sys.version.split()[0])')" ${PEER_PINS[*]}"
	if [[ -f $stamp && $(cat "$stamp") == "$want" && -x $VENV/bin/python ]]; then
		return 0
	fi
	if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
		echo "$PYTHON is $("$PYTHON" -V 2>&1); swe-rex and rl-rock need Python >= 3.10"
		return 0
	fi
	echo "bench-peers: installing ${PEER_PINS[*]} into $VENV (log: $SETUP_LOG)" >&2
	mkdir -p "$(dirname "$SETUP_LOG")"
	rm -rf "$VENV"
	if ! "$PYTHON" -m venv "$VENV" >"$SETUP_LOG" 2>&1; then
		echo "python -m venv failed: $(tail -n 3 "$SETUP_LOG" | tr '\n' ' ')"
		return 0
	fi
	if ! timeout "$PIP_TIMEOUT_S" "$VENV/bin/pip" install --disable-pip-version-check --timeout 60 \
		"${PEER_PINS[@]}" >>"$SETUP_LOG" 2>&1; then
		echo "pip install ${PEER_PINS[*]} failed: $(grep -E '^(ERROR|error)' "$SETUP_LOG" | tail -n 3 | tr '\n' ' ')(full log: $SETUP_LOG)"
		return 0
	fi
	echo "$want" >"$stamp"
}

# wants_peers reports whether the options ask for a peer (by default they all run).
wants_peers() {
	local agents=quarry,swe-rex,rocklet
	while [[ $# -gt 0 ]]; do
		case $1 in
		--agents) agents=${2:-} && shift ;;
		--agents=*) agents=${1#--agents=} ;;
		esac
		shift
	done
	[[ ,$agents, == *,swe-rex,* || ,$agents, == *,rocklet,* ]]
}

setup_error=
if wants_peers "$@"; then
	setup_error=$(setup_peers)
fi

harness_python=$PYTHON
if [[ -z $setup_error && -x $VENV/bin/python ]]; then
	harness_python=$VENV/bin/python
fi
exec "$harness_python" "$root/bench/peers/peers.py" --quarry-agent "$agent" --venv "$VENV" \
	--setup-error "$setup_error" "$@"
