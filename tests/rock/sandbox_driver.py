"""Drives Quarry with ROCK's unmodified Python SDK (rl-rock), as a ROCK user
would, with only the base URL pointed at Quarry and the API key sent as
XRL-Authorization. Prints one line per step: "STEP <json>"; the Go test
(tests/rock_sdk_test.go) asserts on them.

Environment: ROCK_BASE_URL, QUARRY_API_KEY, ROCK_SANDBOX_ID (a caller-chosen id).
"""
import asyncio
import json
import os
import sys
import tempfile

from rock.actions import (
    CloseBashSessionRequest,
    Command,
    CreateBashSessionRequest,
    ReadFileRequest,
    WriteFileRequest,
)
from rock.sdk.sandbox.client import Sandbox
from rock.sdk.sandbox.config import SandboxConfig


def emit(step, **fields):
    print("STEP " + json.dumps({"step": step, **fields}), flush=True)


def config(**kw):
    return SandboxConfig(
        base_url=os.environ["ROCK_BASE_URL"],
        extra_headers={"XRL-Authorization": "Bearer " + os.environ["QUARRY_API_KEY"]},
        startup_timeout=120,
        **kw,
    )


async def main():
    # An image no pool serves: a clear error, no sandbox.
    try:
        await Sandbox(config(image="registry.example/no-such:image")).start()
        emit("bad_image", raised=False)
    except Exception as e:
        emit("bad_image", raised=True, type=type(e).__name__, message=str(e))

    sb = Sandbox(config(sandbox_id=os.environ["ROCK_SANDBOX_ID"]))
    await sb.start()
    status = await sb.get_status()
    emit("start", sandbox_id=sb.sandbox_id, is_alive=status.is_alive)

    # The caller's id reaches the same sandbox, and starting again is idempotent.
    other = Sandbox(config(sandbox_id=os.environ["ROCK_SANDBOX_ID"]))
    await other.start()
    attached = Sandbox(config())
    await attached.attach(os.environ["ROCK_SANDBOX_ID"])
    obs = await attached.arun("echo attached")
    emit("attach", restart_id=other.sandbox_id, output=obs.output)

    obs = await sb.arun("echo hello; echo oops >&2")
    emit("arun_normal", output=obs.output, exit_code=obs.exit_code)

    # Throw-away sessions (arun without a session) are not leaked: more runs
    # than the agent's session limit (64).
    for i in range(70):
        obs = await sb.arun(f"echo run{i}")
    emit("arun_many", output=obs.output)

    await sb.create_session(CreateBashSessionRequest(session="work", env={"GREETING": "hi"}))
    await sb.arun("mkdir -p /tmp/rockwork && cd /tmp/rockwork && export FOO=bar", session="work")
    obs = await sb.arun('pwd; echo "$FOO $GREETING"', session="work")
    emit("session_state", output=obs.output, exit_code=obs.exit_code)

    try:
        await sb.arun("echo before-fail; exit_status_7() { return 7; }; exit_status_7", session="work")
        emit("arun_fail", raised=False)
    except Exception as e:
        emit("arun_fail", raised=True, message=str(e))

    obs = await sb.arun("sh -c 'echo fine; echo to-file'", session="work", mode="nohup", wait_interval=5)
    emit("nohup_ok", output=obs.output, exit_code=obs.exit_code, failure_reason=obs.failure_reason)

    obs = await sb.arun("sh -c 'echo failing; exit 3'", mode="nohup", wait_interval=5)
    emit("nohup_fail", output=obs.output, exit_code=obs.exit_code, failure_reason=obs.failure_reason)

    obs = await sb.arun("pwd", session="work", mode="nohup", wait_interval=5)
    emit("nohup_cwd", output=obs.output, exit_code=obs.exit_code)

    w = await sb.write_file(WriteFileRequest(content="héllo\nwörld\n", path="/tmp/rockfiles/a.txt"))
    r = await sb.read_file(ReadFileRequest(path="/tmp/rockfiles/a.txt"))
    emit("files", write_success=w.success, content=r.content)

    with tempfile.NamedTemporaryFile("wb", suffix=".bin", delete=False) as f:
        f.write(b"uploaded bytes\x00\x01 end")
        local = f.name
    up = await sb.upload_by_path(local, "/tmp/rockfiles/up.bin")
    r = await sb.read_file(ReadFileRequest(path="/tmp/rockfiles/up.bin", encoding="latin-1"))
    os.unlink(local)
    emit("upload", success=up.success, message=up.message, content=r.content)

    ex = await sb.execute(Command(command=["sh", "-c", "echo argv-ok; exit 4"]))
    ex2 = await sb.execute(Command(command="echo $((6*7))", cwd="/tmp"))
    emit("execute", stdout=ex.stdout, exit_code=ex.exit_code, shell_stdout=ex2.stdout)

    await sb.close_session(CloseBashSessionRequest(session="work"))
    try:
        await sb.arun("pwd", session="work")
        emit("closed_session", raised=False)
    except Exception as e:
        emit("closed_session", raised=True, message=str(e))

    alive = await sb.is_alive()
    await sb.stop()
    after = await sb.get_status()
    emit("stop", alive_before=alive.is_alive, alive_after=after.is_alive, status=after.status)
    try:
        await sb.arun("echo after-stop")
        emit("after_stop", raised=False)
    except Exception as e:
        emit("after_stop", raised=True, message=str(e))


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as e:
        emit("crash", type=type(e).__name__, message=str(e))
        sys.exit(1)
