#!/usr/bin/env python3
r"""A complete rollout loop on Quarry: N episodes at once.

Each episode leases a sandbox, uploads an agent (agent.py, which uses the
unmodified openai client) and runs it; the agent's model calls reach the
trainer through the model relay, answered here by q.model.serve with a
scripted policy (a stand-in for the policy being trained: swap in
quarry.openai_adapter.OpenAIForwarder to use a vLLM/SGLang server). A verifier
(verify.py) in the sandbox gives each episode's reward, and the lease's
transcript (every prompt and answer, as the agent built them) is collected.

The agent runs the sandbox's python3, which must import openai. With make run
(the process provider: sandboxes run this machine's python3), from the
repository's root, with make run's QUARRY_URL and QUARRY_API_KEY exported:

    python3 -m venv .venv && .venv/bin/pip install './sdk/python[openai]'
    .venv/bin/python examples/python/rollout.py --episodes 32 --sandbox-pythonpath \
        "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

(--sandbox-pythonpath "$(scripts/python-deps.sh)", openai installed into
.cache/python-deps as make test does, works too). With QUARRY_PROVIDER=docker
make run, the python pool's image has python3 and openai:

    .venv/bin/python examples/python/rollout.py --episodes 32 --pool python

The extra alone is not enough on the process provider: it installs openai for
the trainer's python, not for the sandboxes' python3.

Prints a JSON summary; --out writes one line per episode (reward, transcript).
When episodes fail (the agent exits non-zero), the first failure's stderr is
printed on stderr, and when every episode failed the exit status is 1.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from quarry import AsyncQuarry, ModelCall

HERE = Path(__file__).resolve().parent


def completion(text: str) -> dict[str, Any]:
    return {"id": "cmpl-" + uuid.uuid4().hex[:12], "object": "chat.completion", "created": int(time.time()),
            "model": "policy",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


def chunks(text: str) -> list[dict[str, Any]]:
    base = {"id": "chunk-" + uuid.uuid4().hex[:12], "object": "chat.completion.chunk", "created": int(time.time()),
            "model": "policy"}
    words = re.split(r"(\s+)", text)
    out = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": w}, "finish_reason": None}]}
           for w in words if w]
    out.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return out


def policy_text(call: ModelCall) -> str:
    """The scripted policy: run a command to compute the sum, then answer with
    its output. Episodes labelled policy=noisy get an off-by-one command, so
    the verifier has something to reject."""
    last = call.messages[-1]["content"]
    if last.startswith("OUTPUT:"):
        return "ANSWER: " + last[len("OUTPUT:"):].strip()
    m = re.search(r"Compute (-?\d+) \+ (-?\d+)", last)
    if not m:
        return "ANSWER: unknown"
    extra = 1 if call.labels.get("policy") == "noisy" else 0
    return f"RUN: echo $(({m.group(1)} + {m.group(2)} + {extra}))"


async def policy(call: ModelCall) -> Any:
    text = policy_text(call)
    return chunks(text) if call.stream else completion(text)


async def episode(q: AsyncQuarry, i: int, run: str, rng: random.Random, args: argparse.Namespace) -> dict[str, Any]:
    a, b = rng.randint(1, 10**6), rng.randint(1, 10**6)
    noisy = i % 4 == 3
    labels = {"run": run, "episode": str(i), "policy": "noisy" if noisy else "clean"}
    env = {"TASK_A": str(a), "TASK_B": str(b), "EPISODE_STREAM": "1" if i % 2 else "0"}
    if args.sandbox_pythonpath:
        env["PYTHONPATH"] = args.sandbox_pythonpath
    t0 = time.monotonic()
    async with q.sandboxes.create(pool=args.pool, env=env, labels=labels, lease_seconds=600) as sb:
        await sb.files.write_text("agent.py", (HERE / "agent.py").read_text())
        await sb.files.write_text("verify.py", (HERE / "verify.py").read_text())
        run_res = await sb.exec("python3 agent.py", timeout=120)
        ver = await sb.exec("python3 verify.py", timeout=30)
        reward = float(ver.stdout.strip() or 0.0)
        transcript = await sb.model.transcript()
    return {
        "episode": i, "sandbox": sb.id, "task": [a, b], "noisy": noisy, "stream": i % 2 == 1,
        "agent_exit": run_res.exit_code, "agent_stderr": run_res.stderr[-500:], "reward": reward,
        "seconds": round(time.monotonic() - t0, 3),
        "transcript": [{"state": e.state, "stream": e.stream, "request": e.request,
                        "response": (e.response or {}).get("body")} for e in transcript],
    }


async def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--pool", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concurrency", type=int, default=64, help="policy calls answered at once")
    ap.add_argument("--sandbox-pythonpath", default="",
                    help="PYTHONPATH of the sandboxes' python3: where it finds openai (the process provider)")
    ap.add_argument("--out", default="", help="write one JSON line per episode here")
    args = ap.parse_args(argv)

    run = "rollout-" + uuid.uuid4().hex[:8]
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    async with AsyncQuarry() as q:
        trainer = asyncio.create_task(q.model.serve(policy, concurrency=args.concurrency, labels={"run": run}))
        try:
            results = await asyncio.gather(*(episode(q, i, run, random.Random(rng.random()), args)
                                             for i in range(args.episodes)))
        finally:
            trainer.cancel()
            try:
                await trainer
            except asyncio.CancelledError:
                pass
    if args.out:
        with open(args.out, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    rewards = [r["reward"] for r in results]
    return {
        "run": run, "episodes": len(results), "seconds": round(time.monotonic() - t0, 3),
        "mean_reward": sum(rewards) / max(1, len(rewards)), "rewards": rewards,
        "exchanges": [len(r["transcript"]) for r in results],
        "agent_exits": [r["agent_exit"] for r in results],
        "results": results,
    }


def failures(results: list[dict[str, Any]]) -> str:
    """What went wrong, for stderr: "" when every agent exited 0, else how
    many failed and the first failure's exit status and stderr tail."""
    failed = [r for r in results if r["agent_exit"] != 0]
    if not failed:
        return ""
    first = failed[0]
    tail = first["agent_stderr"].rstrip() or "(nothing on stderr)"
    msg = (f"rollout: {len(failed)} of {len(results)} episodes failed; the first, episode {first['episode']}, "
           f"exited {first['agent_exit']}, and its stderr ends:\n{tail}\n")
    if "openai" in tail and ("ModuleNotFoundError" in tail or "ImportError" in tail):
        msg += ("rollout: the sandboxes' python3 cannot import openai: give it with --sandbox-pythonpath, "
                "or run on an image that has it (--pool python on the Docker provider); see --help\n")
    return msg


if __name__ == "__main__":
    summary = asyncio.run(main(sys.argv[1:]))
    results = summary.pop("results")
    print(json.dumps(summary))
    report = failures(results)
    sys.stderr.write(report)
    if results and all(r["agent_exit"] != 0 for r in results):
        sys.exit(1)
