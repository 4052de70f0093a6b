"""The timed loops of bench/rockbench (make bench; docs/BENCHMARKS.md "ROCK's
SDK"), run with a python that has ROCK's SDK (rl-rock) and, for the relay,
Quarry's SDK on sys.path. Each mode prints one JSON object on stdout.

  nohup URL KEY N          N nohup aruns of `true` in one session: seconds each
  turns URL KEY IMAGE T    ROCK's ModelService in a sandbox of IMAGE, an agent
                           calling it for T turns, the trainer answering each with
                           anti_call_llm: seconds per turn (answer given → next
                           request in hand)
  relay URL KEY POOL T     the same agent on Quarry's relay (OPENAI_BASE_URL), the
                           trainer answering with q.model.calls(): seconds per turn
"""
import asyncio
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "rock"))
import model_env  # noqa: E402,F401  (how ModelService installs in quarry-test/python)

AGENT = (ROOT / "tests" / "rock" / "model_agent.py").read_text()


def completion(content, index):
    return {
        "id": f"chatcmpl-bench-{index}", "object": "chat.completion", "created": int(time.time()),
        "model": "policy",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def rock_sandbox(url, key, image=None):
    from rock.sdk.sandbox.client import Sandbox
    from rock.sdk.sandbox.config import SandboxConfig
    kw = {"image": image} if image else {}
    return Sandbox(SandboxConfig(base_url=url, extra_headers={"XRL-Authorization": "Bearer " + key},
                                 startup_timeout=180, **kw))


async def nohup(url, key, n, cmd):
    from rock.actions import CreateBashSessionRequest
    sb = rock_sandbox(url, key)
    await sb.start()
    await sb.create_session(CreateBashSessionRequest(session="bench"))
    out = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            obs = await sb.arun(cmd, session="bench", mode="nohup")
            out.append(time.perf_counter() - t0)
            if obs.exit_code != 0:
                raise RuntimeError(f"nohup arun of {cmd}: {obs}")
    finally:
        await sb.stop()
    return {"seconds": out}


async def turns(url, key, image, t):
    from rock.sdk.sandbox.model_service.base import ModelService, ModelServiceConfig
    sb = rock_sandbox(url, key, image)
    await sb.start()
    try:
        ms = ModelService(sb, ModelServiceConfig(enabled=True))
        await ms.install()
        await ms.start()
        await sb.write_file_by_path(AGENT, "/tmp/model_agent.py")
        started = await sb.arun(f"python3 /tmp/model_agent.py http://127.0.0.1:8080/v1 {t} /tmp/answers.jsonl"
                                " > /tmp/model_agent.log 2>&1 & echo $!")
        await ms.watch_agent(started.output.strip().splitlines()[-1])
        await ms.anti_call_llm(0)
        out = []
        for i in range(1, t):  # the last answer ends the agent: its turn waits for watch_agent
            t0 = time.perf_counter()
            req = await ms.anti_call_llm(i, json.dumps(completion(f"answer {i}", i)))
            out.append(time.perf_counter() - t0)
            if "turn" not in req:
                raise RuntimeError(f"turn {i}: unexpected request {req[:200]}")
        return {"seconds": out}
    finally:
        await sb.stop()


async def relay(url, key, pool, t):
    sys.path.insert(0, str(ROOT / "sdk" / "python" / "src"))
    from quarry import AsyncQuarry
    async with AsyncQuarry(url, key) as q:
        sb = await q.sandboxes.create(pool=pool)
        try:
            await sb.files.write("/tmp/model_agent.py", AGENT.encode())
            # a background process (an exec's children end with it)
            agent = await sb.start_process(["sh", "-c", f'exec python3 /tmp/model_agent.py "$OPENAI_BASE_URL" {t} /tmp/answers.jsonl'])
            out, t0, i = [], None, 0

            async def loop():
                nonlocal t0, i
                async for call in q.model.calls(max=1, limit=t):
                    if t0 is not None:
                        out.append(time.perf_counter() - t0)
                    i += 1
                    t0 = time.perf_counter()
                    await call.respond(completion(f"answer {i}", i))
            try:
                await asyncio.wait_for(loop(), timeout=60 + t)
            except asyncio.TimeoutError:
                log = await agent.output()
                raise RuntimeError(f"relay: {i} of {t} calls in time; the agent's output: {log}")
            return {"seconds": out}
        finally:
            await sb.release()


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "nohup":
        res = asyncio.run(nohup(args[0], args[1], int(args[2]), args[3]))
    elif mode == "turns":
        res = asyncio.run(turns(args[0], args[1], args[2], int(args[3])))
    elif mode == "relay":
        res = asyncio.run(relay(args[0], args[1], args[2], int(args[3])))
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
