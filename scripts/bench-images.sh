#!/usr/bin/env bash
# make bench-images: images on demand on the Docker provider with a local registry (issue 22,
# docs/BENCHMARKS.md "Images on demand"): a SWE-style batch of 200 images (a shared base plus a
# per-task layer of 3 MiB), 1,000 sandboxes drawn across them, 16 at a time, each running one
# command: (a) no prefetch, (b) prefetch of the batch, (c) the same images as configured pools,
# side by side in one run. Any bench/imagebench flag passes through:
#   scripts/bench-images.sh -images 20 -sandboxes 100        # a smoke run
# It starts what it needs as make test does (the Docker engine and test images, the test
# registry) and stops the registry it started. Results: printed, and .cache/bench/images.{json,txt}.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
mkdir -p .cache/bench bin
scripts/docker-up.sh
scripts/images/build.sh
started=""
if ! scripts/registry.sh status >/dev/null 2>&1; then
  scripts/registry.sh start
  started=1
fi
trap '[ -n "$started" ] && scripts/registry.sh stop' EXIT
eval "$(scripts/registry.sh env)"
export QUARRY_TEST_REGISTRY
make -s build
go run ./bench/imagebench -bin bin -json .cache/bench/images.json "$@" | tee .cache/bench/images.txt
