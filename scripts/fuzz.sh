#!/usr/bin/env bash
# Fuzzes every Go fuzz target (func FuzzX in a _test.go file) for a short time each: make test runs
# it, `make fuzz` too (longer with FUZZTIME). `go test` alone already runs each target on its seeds
# and on its corpus in the tree (<package>/testdata/fuzz/<target>/), which is where the fuzzer writes
# an input that fails: commit it with the fix, and it stays a test.
#   FUZZTIME   how long each target is fuzzed (default 8s; a Go duration, or Nx for N inputs)
#   FUZZ       a regexp of the targets to run (default all)
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime="${FUZZTIME:-8s}"
only="${FUZZ:-.}"
# Each package directory and its targets, from the source (no build needed to list them).
mapfile -t lines < <(grep -rlE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' --exclude-dir=.cache --exclude-dir=node_modules . |
  sort | while read -r file; do
    for target in $(sed -nE 's/^func (Fuzz[A-Za-z0-9_]*)\(f \*testing\.F\).*/\1/p' "$file"); do
      echo "$(dirname "$file") $target"
    done
  done)
[ "${#lines[@]}" -gt 0 ] || { echo "fuzz: no fuzz targets found" >&2; exit 1; }
ran=0
for line in "${lines[@]}"; do
  read -r dir target <<<"$line"
  [[ "$target" =~ $only ]] || continue
  echo "== fuzz $target ($dir, $fuzztime)"
  # -fuzzminimizetime bounds the minimization of each new input (the default, 60 s, stalls a short
  # run on a slow target such as the archive upload).
  if ! out="$(go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -fuzzminimizetime 20x "$dir" 2>&1)"; then
    echo "$out"
    echo "== fuzz: $target found a failing input (written under $dir/testdata/fuzz/$target/: fix the bug, commit the input)" >&2
    exit 1
  fi
  echo "$out" | tail -n 3
  ran=$((ran + 1))
done
echo "== fuzz: $ran targets, $fuzztime each, no failing input"
