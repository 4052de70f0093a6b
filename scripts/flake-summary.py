#!/usr/bin/env python3
"""Summarize a `go test -json` log of a flake hunt (scripts/flake-hunt.sh).

Prints, per package, how many test runs passed, failed and were skipped, and, per test that failed,
how many of its runs failed with the first lines of its first failure's output. Exits 1 when any
test failed or any package's test binary failed without a test to blame (a build failure, a panic
or a -timeout), 0 otherwise.

    python3 scripts/flake-summary.py LOG COUNT
"""
import collections
import json
import sys


def main() -> int:
    path, count = sys.argv[1], int(sys.argv[2])
    runs = collections.Counter()      # (pkg, test) -> runs that ended
    fails = collections.Counter()     # (pkg, test) -> runs that failed
    skips = collections.Counter()
    first_out = {}                    # (pkg, test) -> output of its first failure
    out = collections.defaultdict(list)
    pkg_fail = {}                     # pkg -> output when the package failed
    pkg_out = collections.defaultdict(list)
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                print(line.rstrip())  # build errors are not JSON
                pkg_fail.setdefault("(build)", line)
                continue
            pkg, test, action = ev.get("Package", ""), ev.get("Test"), ev.get("Action")
            key = (pkg, test)
            if action == "output":
                if test:
                    out[key].append(ev.get("Output", ""))
                else:
                    pkg_out[pkg].append(ev.get("Output", ""))
                continue
            if not test:
                if action == "fail":
                    pkg_fail[pkg] = "".join(pkg_out[pkg][-30:])
                continue
            if action in ("pass", "fail", "skip"):
                runs[key] += 1
                if action == "fail":
                    fails[key] += 1
                    first_out.setdefault(key, "".join(out[key][-40:]))
                if action == "skip":
                    skips[key] += 1
                out[key] = []
    pkgs = sorted({p for p, _ in runs})
    print(f"== flake hunt: {path} ({count} runs asked per test)")
    for p in pkgs:
        keys = [k for k in runs if k[0] == p]
        n = sum(runs[k] for k in keys)
        nf = sum(fails[k] for k in keys)
        ns = sum(skips[k] for k in keys)
        print(f"  {p}: {len(keys)} tests, {n} runs, {nf} failed, {ns} skipped")
    failed = sorted((k for k in fails if fails[k]), key=lambda k: -fails[k])
    # A parent fails with its failing subtest: name the leaves.
    leaves = [k for k in failed if not any(o[0] == k[0] and o[1].startswith(k[1] + "/") for o in failed)]
    for k in leaves:
        print(f"\nFAILED {k[0]} {k[1]}: {fails[k]} of {runs[k]} runs")
        print("    " + first_out[k].rstrip().replace("\n", "\n    "))
    for p, text in sorted(pkg_fail.items()):
        if not any(k[0] == p for k in leaves):
            print(f"\nFAILED package {p} (no test to blame: a panic, a timeout or a build failure):")
            print("    " + text.rstrip().replace("\n", "\n    "))
    return 1 if leaves or pkg_fail else 0


if __name__ == "__main__":
    sys.exit(main())
