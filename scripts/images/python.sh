#!/usr/bin/env bash
# Build quarry-test/python:latest locally (no registry is reachable here), idempotently: a real
# Debian userland for sandboxes that run Python programs (the model relay's Docker test runs the
# official openai client in one).
#
#   quarry-test/python   Debian bookworm (debootstrap minbase) with python3, ca-certificates, procps
#                        (kill and ps: ROCK's model service stops its server with /bin/kill), bash
#                        and /bin/sh (dash); the openai package and its dependencies
#                        (scripts/python-deps.sh) baked into /usr/local/lib/python3.11/dist-packages,
#                        which Debian's python3 has on sys.path: `import openai` works for any user,
#                        with no mount and no PYTHONPATH. ROCK's SDK (rl-rock) is there too, with its
#                        `rock` command in /usr/local/bin, and /data/logs writable by every user:
#                        ROCK's ModelService runs in the sandbox (docs/ROCK.md). The example envs of docs/ENVS.md are in
#                        /opt/quarry/envs.
#
# Two steps, each cached:
# Nothing is done when the image's label already matches its inputs (a fresh clone with the image
# in the engine skips debootstrap too). Otherwise:
#  1. debootstrap into .cache/images/python-bookworm (about 50 s and 270 MB, once; reused while the
#     suite, package list and mirror stay the same — the stamp file in it records them);
#  2. one tar stream of that tree plus .cache/python-deps (renamed to dist-packages on the fly)
#     loaded with `docker import` (a few seconds). The image carries the label
#     quarry-test.inputs, a hash of its inputs; the import is skipped when the label matches.
# The mirror is the Debian archive the host's apt sources name (apt_mirror, scripts/deps.sh); the
# script fails, saying what to add, when they name none. Called by scripts/images/build.sh; usable
# on its own.
# Usage: scripts/images/python.sh [--force]
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/deps.sh

force=""
[ "${1:-}" = "--force" ] && force=1
version=2 # bump when the layout below changes
image=quarry-test/python:latest
suite=bookworm
include=python3,ca-certificates,procps
site=usr/local/lib/python3.11/dist-packages
cache=.cache/images/python-$suite

mirror="$(apt_mirror "$suite")"

ensure_apt debootstrap command -v debootstrap
timeout 10 docker info >/dev/null 2>&1 || { echo "no Docker engine answers: run scripts/docker-up.sh first" >&2; exit 1; }
deps="$(scripts/python-deps.sh)"

recipe="suite=$suite include=$include mirror=$mirror"
# The image's inputs: the recipe, this script, and the openai version that
# python-deps.sh installed (its stamp file names it).
want="$({ echo "version=$version $recipe"; sha256sum "$0"; basename -a "$deps"/.installed-*; sha256sum examples/envs/*.py; } | sha256sum | cut -c1-32)"
have="$(docker image inspect --format '{{ index .Config.Labels "quarry-test.inputs" }}' "$image" 2>/dev/null || true)"
if [ -z "$force" ] && [ "$have" = "$want" ]; then
  echo "== $image is up to date"
  exit 0
fi

# Step 1: the root file system, rebuilt only when its recipe changed or a build was interrupted.
stamp="$cache/.quarry-debootstrap"
if [ -n "$force" ] || [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$recipe" ]; then
  echo "== debootstrap $suite ($include) from $mirror into $cache"
  as_root rm -rf "$cache" "$cache.tmp"
  mkdir -p "$(dirname "$cache")"
  as_root debootstrap --variant=minbase --include="$include" "$suite" "$cache.tmp" "$mirror" >"$cache.log" 2>&1 ||
    { echo "debootstrap failed; last lines of $cache.log:" >&2; tail -n 20 "$cache.log" >&2; exit 1; }
  as_root rm -rf "$cache.tmp/var/cache/apt/archives/"*.deb "$cache.tmp/var/lib/apt/lists/"*_Packages
  echo "$recipe" | as_root tee "$cache.tmp/.quarry-debootstrap" >/dev/null
  as_root mv "$cache.tmp" "$cache"
fi

# Step 2: the image, from the tree.
# /dev, /proc and /sys stay empty: the engine mounts its own. Debian's empty site directory makes
# way for python-deps (the engine refuses a tar with a path twice); the host's console scripts
# (bin/, whose shebangs name the host's python) are left out of it. The example envs
# (examples/envs, docs/ENVS.md) go to /opt/quarry/envs.
# The `rock` console script, with the image's python in its shebang (pip wrote the host's), and
# /data/logs, writable by every user: ROCK's model service keeps its log there by default.
extra="$PWD/.cache/images/python-extra"
rm -rf "$extra" && mkdir -p "$extra/usr/local/bin" "$extra/data/logs"
printf '#!/usr/bin/python3\nimport sys\nfrom rock.cli.main import main\nsys.exit(main())\n' >"$extra/usr/local/bin/rock"
chmod 755 "$extra/usr/local/bin/rock" "$extra/data"
chmod 1777 "$extra/data/logs"
as_root tar --numeric-owner -c \
    --exclude=./dev/* --exclude=./proc/* --exclude=./sys/* --exclude=./.quarry-debootstrap --exclude="./$site" \
    -C "$cache" . \
    --exclude=python-deps/bin --transform="s,^python-deps,$site," \
    -C "$(dirname "$deps")" "$(basename "$deps")" \
    --exclude=__pycache__ --transform="s,^envs,opt/quarry/envs," -C "$PWD/examples" envs \
    --owner=0 --group=0 -C "$extra" ./usr/local/bin/rock ./data |
  docker import --change "LABEL quarry-test.inputs=$want" --change 'CMD ["/bin/bash"]' - "$image" >/dev/null
echo "== built $image"
