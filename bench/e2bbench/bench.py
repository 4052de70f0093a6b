#!/usr/bin/env python3
"""E2B's unmodified SDK on Quarry (make bench; docs/BENCHMARKS.md "E2B's SDK").

Run with the python of a venv that has `e2b` (scripts/e2b-sdk.sh); Quarry's own Python SDK is
imported from sdk/python/src.

1. overhead: one sandbox, `true` run N times through E2B's sync SDK (commands.run, which is
   `/bin/bash -l -c true` over envd's Start stream) and through Quarry's sync SDK on the same
   sandbox (exec, a one-shot command; and a session run), interleaved in blocks; p50/p99 of each
   and E2B's p50 over Quarry's exec.
2. fleet: one asyncio process creates S sandboxes at once through E2B's async SDK (default 100)
   and runs R commands in each, all at once, through one gateway: p50/p99 of create and of
   commands.run, wall time, failures.

A gateway (process provider, embedded store) is started on a free port with a temp data dir, as
the SDK's tests do, and stopped at the end. The SDK reaches it with E2B_API_URL = E2B_SANDBOX_URL
(routing by headers).
"""
from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "sdk" / "python" / "src"))
sys.path.insert(0, str(ROOT / "sdk" / "python" / "tests"))
sys.path.insert(0, str(ROOT / "bench" / "pysdk"))

from benchlib import parse_args, report_header, summary  # noqa: E402
from gateway import Gateway  # noqa: E402

from quarry import Quarry  # noqa: E402

POOLS = """pools:
  - name: default
    image: host
    min_warm: {n}
    max_total: {n}
    default_lease_seconds: 600
"""


def point_e2b_at(gw: Gateway, key: str) -> None:
    """E2B's environment variables only, as a user switching from E2B sets them."""
    for k in [k for k in os.environ if k.startswith("E2B_")]:
        del os.environ[k]
    os.environ.update({"E2B_API_URL": gw.url, "E2B_SANDBOX_URL": gw.url, "E2B_API_KEY": key})


def overhead(gw: Gateway, key: str, runs: int, block: int) -> dict[str, Any]:
    from e2b import Sandbox

    e2b_t: list[float] = []
    exec_t: list[float] = []
    sess_t: list[float] = []
    sbx = Sandbox.create("base", timeout=600)
    try:
        with Quarry(gw.url, key) as q:
            qsb = q.sandboxes.attach(sbx.sandbox_id)
            with qsb.session() as s:
                for _ in range(20):  # warm every path's connections
                    sbx.commands.run("true")
                    qsb.exec("true")
                    s.run("true")
                done = 0
                while done < runs:
                    for _ in range(block):
                        t0 = time.perf_counter()
                        sbx.commands.run("true")
                        e2b_t.append(time.perf_counter() - t0)
                    for _ in range(block):
                        t0 = time.perf_counter()
                        qsb.exec("true")
                        exec_t.append(time.perf_counter() - t0)
                    for _ in range(block):
                        t0 = time.perf_counter()
                        s.run("true")
                        sess_t.append(time.perf_counter() - t0)
                    done += block
    finally:
        sbx.kill()
    e, x, s_ = summary(e2b_t), summary(exec_t), summary(sess_t)
    return {"e2b_commands_run": e, "quarry_exec": x, "quarry_session_run": s_,
            "e2b_over_quarry_exec_p50": round(e["p50_ms"] / x["p50_ms"], 3)}


async def fleet(n: int, runs: int) -> dict[str, Any]:
    from e2b import AsyncSandbox

    create_t: list[float] = []
    run_t: list[float] = []
    kill_t: list[float] = []
    failures: list[str] = []

    async def one(i: int) -> None:
        try:
            t0 = time.perf_counter()
            sbx = await AsyncSandbox.create("base", timeout=600)
            create_t.append(time.perf_counter() - t0)
            try:
                for j in range(runs):
                    t1 = time.perf_counter()
                    r = await sbx.commands.run(f"echo {i}-{j}")
                    run_t.append(time.perf_counter() - t1)
                    if r.stdout != f"{i}-{j}\n":
                        failures.append(f"{sbx.sandbox_id}: {r.stdout!r}")
            finally:
                t2 = time.perf_counter()
                await sbx.kill()
                kill_t.append(time.perf_counter() - t2)
        except Exception as e:  # counted, not hidden
            failures.append(f"{type(e).__name__}: {e}")

    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {"sandboxes": n, "runs_each": runs, "wall_s": round(wall, 3), "client_cpu_s": round(cpu, 3),
            "create": summary(create_t) if create_t else {}, "run": summary(run_t) if run_t else {},
            "kill": summary(kill_t) if kill_t else {}, "failures": len(failures), "failure_sample": failures[:5]}


def wait_ready(gw: Gateway, key: str, n: int, timeout: float) -> float:
    t0 = time.perf_counter()
    with Quarry(gw.url, key) as q:
        while True:
            ps = {p.name: p for p in q.pools()}
            if ps["default"].ready >= n:
                return time.perf_counter() - t0
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"pool default: {ps['default'].ready} of {n} ready after {timeout}s")
            time.sleep(0.5)


def start(bin_dir: Path, n: int) -> tuple[Gateway, str]:
    key = "e2b_" + os.urandom(20).hex()  # the shape the SDK checks
    gw = Gateway(bin_dir, pools=POOLS.format(n=n), env={"QUARRY_API_KEYS": key})
    point_e2b_at(gw, key)
    return gw, key


def main() -> None:
    args = parse_args(1000, "runs per path (overhead; 0 skips it)", 100, {"block": 50})
    from importlib.metadata import version

    out: dict[str, Any] = report_header(e2b=version("e2b"))
    bin_dir = Path(args.bin)
    if args.runs:
        gw, key = start(bin_dir, 2)
        try:
            wait_ready(gw, key, 1, 120)
            o = overhead(gw, key, args.runs, args.block)
        finally:
            gw.stop()
        out["overhead"] = o
        print(f"e2b {out['e2b']}, `true` x{o['quarry_exec']['n']} on one sandbox (sync clients, interleaved): "
              f"E2B commands.run p50 {o['e2b_commands_run']['p50_ms']} ms p99 {o['e2b_commands_run']['p99_ms']} ms; "
              f"Quarry exec p50 {o['quarry_exec']['p50_ms']} ms p99 {o['quarry_exec']['p99_ms']} ms; "
              f"Quarry session run p50 {o['quarry_session_run']['p50_ms']} ms p99 {o['quarry_session_run']['p99_ms']} ms; "
              f"E2B/Quarry exec p50 {o['e2b_over_quarry_exec_p50']}")
    if args.sandboxes:
        n = args.sandboxes
        gw, key = start(bin_dir, n)
        try:
            warm = wait_ready(gw, key, n, 600)
            f = asyncio.run(fleet(n, args.runs_each))
            f["pool_warmup_s"] = round(warm, 1)
        finally:
            gw.stop()
        out["fleet"] = f
        print(f"fleet: {n} sandboxes created at once through E2B's async SDK, {args.runs_each} commands.run each, "
              f"one gateway: wall {f['wall_s']} s, client CPU {f['client_cpu_s']} s; "
              f"create p50 {f['create'].get('p50_ms')} p99 {f['create'].get('p99_ms')} ms; "
              f"commands.run p50 {f['run'].get('p50_ms')} p99 {f['run'].get('p99_ms')} ms; "
              f"kill p50 {f['kill'].get('p50_ms')} p99 {f['kill'].get('p99_ms')} ms; failures {f['failures']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    if out.get("fleet", {}).get("failures"):
        sys.exit(1)


if __name__ == "__main__":
    main()
