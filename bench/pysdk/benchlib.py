"""What the Python benchmarks share (bench/pysdk/bench.py, bench/e2bbench/bench.py): percentiles, a
latency summary, and their command line (the gateway's binaries, runs, a fleet, a JSON report)."""
from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def summary(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "p50_ms": round(pct(xs, 50) * 1000, 3), "p99_ms": round(pct(xs, 99) * 1000, 3),
            "mean_ms": round(statistics.fmean(xs) * 1000, 3)}


def parse_args(runs: int, runs_help: str, sandboxes: int, extra: dict[str, int] | None = None) -> argparse.Namespace:
    """The benchmarks' command line; it also raises the open-file limit to its hard limit (a fleet
    holds a connection per sandbox)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "bin"))
    ap.add_argument("--runs", type=int, default=runs, help=runs_help)
    for name, default in (extra or {}).items():
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--sandboxes", type=int, default=sandboxes, help="the fleet's sandboxes (0 skips it)")
    ap.add_argument("--runs-each", type=int, default=10)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return args


def report_header(**extra: Any) -> dict[str, Any]:
    """The report's first fields: when, which Python, and the caller's."""
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "python": sys.version.split()[0], **extra}
