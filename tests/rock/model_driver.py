"""ROLL's loop through ROCK's unmodified SDK (rl-rock) on Quarry: ROCK's
ModelService installed, started and watched in a sandbox of an image that
has rl-rock, an agent (model_agent.py) calling it as an OpenAI endpoint for
TURNS turns, and the trainer answering every call with
ModelService.anti_call_llm, as ROLL's agentic pipeline does. Prints one
line per step: "STEP <json>"; tests/rock_model_test.go asserts on them.

Environment: ROCK_BASE_URL, QUARRY_API_KEY, ROCK_IMAGE, TURNS. How the SDK
installs its runtime and model service in the image: model_env.py.
"""
import model_env  # noqa: F401  (before the SDK reads its variables)

import asyncio
import json
import os
import sys
import time
import traceback
from pathlib import Path

from rock.sdk.sandbox.client import Sandbox
from rock.sdk.sandbox.config import SandboxConfig
from rock.sdk.sandbox.model_service.base import ModelService, ModelServiceConfig

SESSION_END = "SESSION_END"


def emit(step, **fields):
    print("STEP " + json.dumps({"step": step, **fields}), flush=True)


def completion(content, index):
    """An OpenAI chat completion, as the trainer's inference would return it."""
    return json.dumps({
        "id": f"chatcmpl-trainer-{index}", "object": "chat.completion", "created": int(time.time()),
        "model": "policy",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    })


async def main():
    turns = int(os.environ.get("TURNS", "5"))
    sb = Sandbox(SandboxConfig(
        base_url=os.environ["ROCK_BASE_URL"],
        extra_headers={"XRL-Authorization": "Bearer " + os.environ["QUARRY_API_KEY"]},
        image=os.environ["ROCK_IMAGE"],
        startup_timeout=180,
    ))
    await sb.start()
    emit("start", sandbox_id=sb.sandbox_id)

    ms = ModelService(sb, ModelServiceConfig(enabled=True))
    t0 = time.perf_counter()
    await ms.install()
    emit("install", seconds=time.perf_counter() - t0)
    t0 = time.perf_counter()
    await ms.start()
    health = await sb.arun("python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8080/health').read().decode())\"")
    emit("start_service", seconds=time.perf_counter() - t0, health=health.output, exit_code=health.exit_code)

    agent = Path(__file__).with_name("model_agent.py").read_text()
    await sb.write_file_by_path(agent, "/tmp/model_agent.py")
    started = await sb.arun(
        f"python3 /tmp/model_agent.py http://127.0.0.1:8080/v1 {turns} /tmp/answers.jsonl"
        " > /tmp/model_agent.log 2>&1 & echo $!", session=None)
    pid = started.output.strip().splitlines()[-1]
    await ms.watch_agent(pid)
    emit("agent", pid=pid)

    # The trainer's loop: the agent's first request, then one answer per
    # request until the agent is done (SESSION_END, once watch_agent sees
    # it exit).
    requests, seconds = [], []
    req = await ms.anti_call_llm(0)
    requests.append(json.loads(req))
    index = 1
    while True:
        t0 = time.perf_counter()
        req = await ms.anti_call_llm(index, completion(f"answer {index}", index))
        seconds.append(time.perf_counter() - t0)
        if req.strip() == SESSION_END:
            break
        requests.append(json.loads(req))
        index += 1
        if index > turns + 1:
            emit("too_many_turns", index=index)
            break
    emit("loop", requests=requests, seconds=seconds, answered=index)

    answers = await sb.arun("cat /tmp/answers.jsonl")
    log = await sb.arun("cat /tmp/model_agent.log")
    emit("answers", answers=[json.loads(l) for l in answers.output.splitlines() if l.strip()], agent_log=log.output)

    await ms.stop()
    down = await sb.arun("python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:8080/health')\" 2>/dev/null; echo $?")
    emit("stop_service", probe_exit=down.output.strip())
    await sb.stop()
    emit("stopped", ok=True)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as e:
        traceback.print_exc()
        emit("crash", type=type(e).__name__, message=repr(e))
        sys.exit(1)
