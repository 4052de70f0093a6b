"""Starts a sandbox of an image that no pool names with ROCK's unmodified
Python SDK (rl-rock), runs a command in it and stops it. Prints one line per
step: "STEP <json>"; tests/images_test.go asserts on them.

Environment: ROCK_BASE_URL, QUARRY_API_KEY, ROCK_IMAGE.
"""
import asyncio
import json
import os

from rock.sdk.sandbox.client import Sandbox
from rock.sdk.sandbox.config import SandboxConfig


def emit(step, **fields):
    print("STEP " + json.dumps({"step": step, **fields}), flush=True)


async def main():
    sb = Sandbox(SandboxConfig(
        base_url=os.environ["ROCK_BASE_URL"],
        extra_headers={"XRL-Authorization": "Bearer " + os.environ["QUARRY_API_KEY"]},
        image=os.environ["ROCK_IMAGE"],
        startup_timeout=180,
    ))
    await sb.start()
    obs = await sb.arun("wc -c < /data")
    emit("run", output=obs.output, exit_code=obs.exit_code)
    await sb.stop()
    emit("stopped", ok=True)


try:
    asyncio.run(main())
except Exception as e:  # a crash is a step too: the Go test shows it
    emit("crash", type=type(e).__name__, message=str(e))
    raise
