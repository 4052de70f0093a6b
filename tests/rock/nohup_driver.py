"""ROCK's nohup mode through the unmodified SDK (rl-rock) against a gateway
whose hold of a job's "kill -0" checks is HOLD seconds: how long each arun
takes and what it returns. Prints one line per step: "STEP <json>";
tests/rock_nohup_test.go asserts on them.

Environment: ROCK_BASE_URL, QUARRY_API_KEY.
"""
import asyncio
import json
import os
import sys
import time

from rock.actions import BashAction, CreateBashSessionRequest
from rock.sdk.sandbox.client import Sandbox
from rock.sdk.sandbox.config import SandboxConfig


def emit(step, **fields):
    print("STEP " + json.dumps({"step": step, **fields}), flush=True)


async def timed_arun(sb, step, cmd, **kw):
    t0 = time.perf_counter()
    obs = await sb.arun(cmd, mode="nohup", **kw)
    emit(step, seconds=time.perf_counter() - t0, output=obs.output, exit_code=obs.exit_code,
         failure_reason=obs.failure_reason)


async def timed_check(sb, step, session, cmd):
    t0 = time.perf_counter()
    try:
        obs = await sb.run_in_session(BashAction(session=session, command=cmd, check="silent"))
        emit(step, seconds=time.perf_counter() - t0, exit_code=obs.exit_code, output=obs.output)
    except Exception as e:
        emit(step, seconds=time.perf_counter() - t0, raised=True, message=str(e))


async def main():
    sb = Sandbox(SandboxConfig(
        base_url=os.environ["ROCK_BASE_URL"],
        extra_headers={"XRL-Authorization": "Bearer " + os.environ["QUARRY_API_KEY"]},
        startup_timeout=120,
    ))
    await sb.start()
    await sb.create_session(CreateBashSessionRequest(session="jobs"))

    # A quick job: its check is answered when it exits, not after a 5 s sleep.
    await timed_arun(sb, "quick", "echo quick", session="jobs", wait_interval=3)
    await timed_arun(sb, "quick_fail", "sh -c 'echo failing; exit 3'", session="jobs")
    # A job that outlives the hold and exits while the SDK sleeps before its
    # next check (answered at that check); one that is still running at that
    # check too (answered when it exits).
    await timed_arun(sb, "exits_in_sleep", "sleep 6; echo late", session="jobs", wait_interval=5)
    await timed_arun(sb, "outlives_hold", "sleep 11; echo long", session="jobs", wait_interval=5)

    # A "kill -0" of a process that is no nohup job of the SDK's is run at once.
    bg = await sb.arun("sleep 60 > /dev/null 2>&1 & echo $!", session="jobs")
    await timed_check(sb, "unrelated_alive", "jobs", f"kill -0 {bg.output.strip()}")
    await timed_check(sb, "unrelated_gone", "jobs", "kill -0 4194000")

    # wait_timeout: shorter than the job and than the hold (the SDK gives up
    # its check while the gateway holds it, then says the job did not
    # complete),
    # longer than the job, and the SDK's usual values.
    await timed_arun(sb, "timeout_3", "sleep 6; echo too-late", session="jobs", wait_timeout=3)
    await timed_arun(sb, "timeout_10", "sleep 2; echo in-time", session="jobs", wait_timeout=10)
    await timed_arun(sb, "timeout_60", "echo at-once", session="jobs", wait_timeout=60)
    # The session is usable after all of it.
    obs = await sb.arun("echo still-usable", session="jobs")
    emit("after", output=obs.output, exit_code=obs.exit_code)
    await sb.stop()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as e:
        emit("crash", type=type(e).__name__, message=repr(e))
        sys.exit(1)
