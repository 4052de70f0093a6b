#!/usr/bin/env bash
# Fuzzes every Go fuzz target (func FuzzX in a _test.go file) for a short time each: make test runs
# it, `make fuzz` too (longer with FUZZTIME). `go test` alone already runs each target on its seeds
# and on its corpus in the tree (<package>/testdata/fuzz/<target>/), which is where the fuzzer writes
# an input that fails: commit it with the fix, and it stays a test.
#   FUZZTIME   how long each target is fuzzed (default 8s; s, m and h, as 90s, 10m or 1h30m), or Nx
#              for N inputs in one run
#   FUZZ       a regexp of the targets to run (default all)
#
# The time is this script's, never Go's: a duration given to `go test -fuzztime` is a context
# deadline, and Go before 1.27 can report that deadline as the target's failure ("context deadline
# exceeded", no input written; go.dev/issue/75804: the coordinator compares the deadline's error with
# its child context's before the child is cancelled). So a target is fuzzed in rounds of N inputs
# (`-fuzztime Nx`, no deadline), each round sized from the last one's rate, until the time is spent.
# The inputs a round finds interesting stay in Go's fuzz cache, and the next round starts from them.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime="${FUZZTIME:-8s}"
only="${FUZZ:-.}"

# seconds prints a duration of s, m and h (90s, 10m, 1h30m) in seconds.
seconds() {
  [[ "$1" =~ ^([0-9]+h)?([0-9]+m)?([0-9]+s)?$ && -n "$1" ]] || return 1
  local h="${BASH_REMATCH[1]%h}" m="${BASH_REMATCH[2]%m}" s="${BASH_REMATCH[3]%s}"
  echo $((10#${h:-0} * 3600 + 10#${m:-0} * 60 + 10#${s:-0}))
}
count=""
if [[ "$fuzztime" =~ ^[0-9]+x$ ]]; then
  count="$fuzztime"
elif ! budget="$(seconds "$fuzztime")" || [ "$budget" -le 0 ]; then
  echo "fuzz: FUZZTIME=$fuzztime is neither a duration of s, m and h (8s, 10m, 1h30m) nor Nx" >&2
  exit 2
fi

# Each package directory and its targets, from the source (no build needed to list them).
mapfile -t lines < <(grep -rlE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' --exclude-dir=.cache --exclude-dir=node_modules . |
  sort | while read -r file; do
    for target in $(sed -nE 's/^func (Fuzz[A-Za-z0-9_]*)\(f \*testing\.F\).*/\1/p' "$file"); do
      echo "$(dirname "$file") $target"
    done
  done)
[ "${#lines[@]}" -gt 0 ] || { echo "fuzz: no fuzz targets found" >&2; exit 1; }

# round fuzzes $target in $dir for $1 inputs; on a failure it prints the output, says whether the
# fuzzer wrote an input, and exits.
round() {
  local corpus="$dir/testdata/fuzz/$target" before after out
  before="$( (ls "$corpus" 2>/dev/null || true) | wc -l)"
  # -fuzzminimizetime bounds the minimization of each new input (the default, 60 s, stalls a short
  # run on a slow target such as the archive upload).
  if out="$(go test -run '^$' -fuzz "^${target}\$" -fuzztime "$1" -fuzzminimizetime 20x "$dir" 2>&1)"; then
    last="$(echo "$out" | grep -E '^fuzz: elapsed' | tail -n 1)"
    return 0
  fi
  echo "$out"
  after="$( (ls "$corpus" 2>/dev/null || true) | wc -l)"
  if [ "$after" -gt "$before" ]; then
    echo "== fuzz: $target found a failing input (written under $corpus/: fix the bug, commit the input)" >&2
  else
    echo "== fuzz: $target failed without writing an input (the output above says why)" >&2
  fi
  exit 1
}

ran=0
for line in "${lines[@]}"; do
  read -r dir target <<<"$line"
  [[ "$target" =~ $only ]] || continue
  echo "== fuzz $target ($dir, $fuzztime)"
  if [ -n "$count" ]; then
    round "$count"
    echo "$last"
  else
    # A round of one input builds the target, outside the budget (as Go's own -fuzztime starts
    # after the build), and says how large its corpus is. Each round then replays the corpus
    # (Go counts those runs among its N, and they are slow: a second or two for a large corpus)
    # before it fuzzes new inputs, so a round is the corpus plus m new inputs. From two rounds of
    # different m the script learns the rate and the start-up (took = start-up + m / rate), and
    # sizes the next round to fill the time left (at most 30 s, at most 16 times the last m). The
    # first two rounds are 100 and 1,000 new inputs. It stops when the time is spent, or when what
    # is left would go to the start-up alone; the last round may end past the budget by the error
    # of the estimate.
    now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
    corpus_of() { echo "$1" | sed -nE 's/.*\(total: ([0-9]+)\).*/\1/p; s/.*baseline coverage: [0-9]+\/([0-9]+).*/\1/p' | tail -n 1; }
    round 1x
    start=$(now_ms) m=100 inputs=0 rounds=0 prev_m=0 prev_took=0
    while :; do
      corpus="$(corpus_of "$last")"
      t0=$(now_ms)
      round "$(( ${corpus:-0} + m ))x"
      took=$(( $(now_ms) - t0 + 1 ))
      inputs=$((inputs + m)) rounds=$((rounds + 1))
      left=$(( budget * 1000 - ($(now_ms) - start) ))
      per_s=0 over=0
      if [ "$prev_m" -gt 0 ] && [ "$m" -gt "$prev_m" ] && [ "$took" -gt "$prev_took" ]; then
        per_s=$(( (m - prev_m) * 1000 / (took - prev_took) ))
      fi
      prev_m=$m prev_took=$took
      if [ "$per_s" -le 0 ]; then
        # Not known yet: the second round (or one after a round that told nothing).
        [ "$left" -gt 250 ] || break
        m=1000
        [ "$rounds" -eq 1 ] || m=$((prev_m * 4))
        continue
      fi
      over=$(( took - m * 1000 / per_s )); [ "$over" -ge 0 ] || over=0
      [ "$left" -gt $((over + 250)) ] || break
      run=$(( left - over )); [ "$run" -le 30000 ] || run=30000
      m=$(( per_s * run / 1000 ))
      [ "$m" -le $((prev_m * 16)) ] || m=$((prev_m * 16))
      [ "$m" -ge 100 ] || m=100
    done
    spent=$(( $(now_ms) - start ))
    echo "$last"
    printf 'fuzz: %s: %d new inputs in %d rounds, %d.%d s (start-up %d ms a round)\n' "$target" "$inputs" "$rounds" \
      $((spent / 1000)) $((spent % 1000 / 100)) "$over"
  fi
  ran=$((ran + 1))
done
echo "== fuzz: $ran targets, $fuzztime each, no failing input"
