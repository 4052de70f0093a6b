#!/usr/bin/env python3
"""Benchmarks of the Python SDK (make bench; docs/BENCHMARKS.md "Python SDK").

1. overhead: one session, `true` run N times through raw httpx (the same pool
   settings, the same JSON) and through the SDK (AsyncQuarry, and the sync
   Quarry), interleaved in blocks; p50/p99 per run and the SDK's p50 over raw.
2. fleet: one asyncio process drives S sandboxes at once (default 1,000): each
   acquires (from a pool kept warm with S ready), opens a session, runs 10
   commands, releases. Wall time, p50/p99 of acquire / run / release, and the
   client process's CPU (user+sys) over the fleet phase.

A gateway (process provider, embedded store) is started on a free port with a
temp data dir, as the SDK's tests do, and stopped at the end.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "sdk" / "python" / "src"))
sys.path.insert(0, str(ROOT / "sdk" / "python" / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from benchlib import parse_args, report_header, summary  # noqa: E402
from gateway import Gateway  # noqa: E402

from quarry import AsyncQuarry, Quarry  # noqa: E402


async def overhead(gw: Gateway, runs: int, block: int) -> dict[str, Any]:
    raw_t: list[float] = []
    sdk_t: list[float] = []
    async with AsyncQuarry(gw.url, gw.key) as q, q.sandboxes.create() as sb, sb.session() as s:
        raw = httpx.AsyncClient(base_url=gw.url, headers={"Authorization": f"Bearer {gw.key}"},
                                limits=httpx.Limits(max_connections=4096, max_keepalive_connections=1024),
                                timeout=60)
        path = f"/v1/sandboxes/{sb.id}/sessions/{s.id}/run"
        body = json.dumps({"command": "true"}).encode()
        hdr = {"Content-Type": "application/json", "Accept": "application/json"}
        for _ in range(20):  # warm both paths' connections
            (await raw.post(path, content=body, headers=hdr)).raise_for_status()
            await s.run("true")
        done = 0
        while done < runs:
            for _ in range(block):
                t0 = time.perf_counter()
                r = await raw.post(path, content=body, headers=hdr)
                r.raise_for_status()
                r.json()
                raw_t.append(time.perf_counter() - t0)
            for _ in range(block):
                t0 = time.perf_counter()
                await s.run("true")
                sdk_t.append(time.perf_counter() - t0)
            done += block
        await raw.aclose()

    # The sync client (a thread hop to its loop) beside the async one, on exec.
    sync_exec: list[float] = []
    async_exec: list[float] = []
    async with AsyncQuarry(gw.url, gw.key) as q, q.sandboxes.create() as sb2:
        with Quarry(gw.url, gw.key) as sq:
            ssb = sq.sandboxes.attach(sb2.id)
            for _ in range(20):
                ssb.exec("true")
                await sb2.exec("true")
            done = 0
            while done < runs:
                for _ in range(block):
                    t0 = time.perf_counter()
                    await sb2.exec("true")
                    async_exec.append(time.perf_counter() - t0)
                sync_exec += await asyncio.to_thread(time_sync, ssb, block)
                done += block
    r, k = summary(raw_t), summary(sdk_t)
    return {"session_run_raw_httpx": r, "session_run_sdk": k,
            "sdk_over_raw_p50": round(k["p50_ms"] / r["p50_ms"], 3),
            "exec_async_sdk": summary(async_exec), "exec_sync_sdk": summary(sync_exec)}


def time_sync(sb: Any, n: int) -> list[float]:
    """n execs through the sync client, timed in the calling thread."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        sb.exec("true")
        out.append(time.perf_counter() - t0)
    return out


async def fleet(gw: Gateway, n: int, runs: int) -> dict[str, Any]:
    acq: list[float] = []
    run_t: list[float] = []
    rel: list[float] = []
    failures: list[str] = []

    async def one(q: AsyncQuarry, i: int) -> None:
        try:
            t0 = time.perf_counter()
            sb = await q.sandboxes.create(labels={"bench": "fleet"})
            acq.append(time.perf_counter() - t0)
            async with sb.session() as s:
                for j in range(runs):
                    t1 = time.perf_counter()
                    r = await s.run(f"echo {i}-{j}")
                    run_t.append(time.perf_counter() - t1)
                    if r.output != f"{i}-{j}\n":
                        failures.append(f"{sb.id}: {r.output!r}")
            t2 = time.perf_counter()
            await sb.release()
            rel.append(time.perf_counter() - t2)
        except Exception as e:  # counted, not hidden
            failures.append(f"{type(e).__name__}: {e}")

    async with AsyncQuarry(gw.url, gw.key) as q:
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        await asyncio.gather(*(one(q, i) for i in range(n)))
        wall = time.perf_counter() - t0
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {"sandboxes": n, "runs_each": runs, "wall_s": round(wall, 3), "client_cpu_s": round(cpu, 3),
            "client_cpu_per_call_ms": round(cpu / max(1, len(acq) + len(run_t) + len(rel) + 2 * n) * 1000, 3),
            "client_max_rss_mb": round(ru1.ru_maxrss / 1024, 1),
            "acquire": summary(acq) if acq else {}, "run": summary(run_t) if run_t else {},
            "release": summary(rel) if rel else {}, "failures": len(failures), "failure_sample": failures[:5]}


async def wait_ready(gw: Gateway, n: int, timeout: float) -> float:
    t0 = time.perf_counter()
    async with AsyncQuarry(gw.url, gw.key) as q:
        while True:
            ps = {p.name: p for p in await q.pools()}
            if ps["default"].ready >= n:
                return time.perf_counter() - t0
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"pool default: {ps['default'].ready} of {n} ready after {timeout}s")
            await asyncio.sleep(1)


def main() -> None:
    args = parse_args(2000, "session runs per path (overhead; 0 skips it)", 1000)
    out: dict[str, Any] = report_header(httpx=httpx.__version__)
    if args.runs:
        report_overhead(out, args)
    if args.sandboxes:
        report_fleet(out, args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    if out.get("fleet", {}).get("failures"):
        sys.exit(1)


def report_overhead(out: dict[str, Any], args: argparse.Namespace) -> None:
    gw = Gateway(Path(args.bin), min_warm=2, max_total=8)
    try:
        out["overhead"] = asyncio.run(overhead(gw, args.runs, 100))
    finally:
        gw.stop()
    o = out["overhead"]
    print(f"session run (true), {o['session_run_raw_httpx']['n']} each: raw httpx p50 {o['session_run_raw_httpx']['p50_ms']} ms "
          f"p99 {o['session_run_raw_httpx']['p99_ms']} ms; SDK p50 {o['session_run_sdk']['p50_ms']} ms "
          f"p99 {o['session_run_sdk']['p99_ms']} ms; SDK/raw p50 {o['sdk_over_raw_p50']}")
    print(f"exec (true): AsyncQuarry p50 {o['exec_async_sdk']['p50_ms']} ms p99 {o['exec_async_sdk']['p99_ms']} ms; "
          f"Quarry (sync) p50 {o['exec_sync_sdk']['p50_ms']} ms p99 {o['exec_sync_sdk']['p99_ms']} ms")


def report_fleet(out: dict[str, Any], args: argparse.Namespace) -> None:
    n = args.sandboxes
    gw = Gateway(Path(args.bin), min_warm=n, max_total=n)
    try:
        warm = asyncio.run(wait_ready(gw, n, 900))
        f = asyncio.run(fleet(gw, n, args.runs_each))
        f["pool_warmup_s"] = round(warm, 1)
        out["fleet"] = f
    finally:
        gw.stop()
    print(f"fleet: {n} sandboxes x {args.runs_each} session runs from one asyncio process: wall {f['wall_s']} s, "
          f"client CPU {f['client_cpu_s']} s ({f['client_cpu_per_call_ms']} ms/call), max RSS {f['client_max_rss_mb']} MB; "
          f"acquire p50 {f['acquire'].get('p50_ms')} p99 {f['acquire'].get('p99_ms')} ms; "
          f"run p50 {f['run'].get('p50_ms')} p99 {f['run'].get('p99_ms')} ms; "
          f"release p50 {f['release'].get('p50_ms')} p99 {f['release'].get('p99_ms')} ms; "
          f"failures {f['failures']} (pool warm-up {f['pool_warmup_s']} s)")


if __name__ == "__main__":
    main()
