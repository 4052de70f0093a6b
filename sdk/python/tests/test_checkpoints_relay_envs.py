"""Checkpoints, restore and fork; the relay's trainer side (calls, respond,
respond_stream, serve, the openai adapter, transcript); envs (and gymnasium)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import aio
from gateway import Gateway

import quarry
from quarry import AsyncQuarry, ModelCall, errors

AGENT = r"""
import sys, openai
c = openai.OpenAI(max_retries=0)
stream = sys.argv[1] == "stream"
msgs = [{"role": "user", "content": sys.argv[2]}]
if stream:
    text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(model="policy", messages=msgs, stream=True) if ch.choices)
else:
    text = c.chat.completions.create(model="policy", messages=msgs).choices[0].message.content
print(text)
"""


def completion(text: str) -> dict[str, Any]:
    return {"id": "cmpl-1", "object": "chat.completion", "created": 0, "model": "policy",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


def chunk(text: str | None, finish: str | None = None) -> dict[str, Any]:
    delta = {"content": text} if text is not None else {}
    return {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "policy",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


@aio
async def test_checkpoint_restore_fork(gw: Gateway) -> None:
    async with AsyncQuarry(gw.url, gw.key) as q, q.sandboxes.create() as sb:
        await sb.files.write("w/keep.txt", "v1")
        ck = await sb.checkpoint(["w"], exclude=["*.pyc"], labels={"step": "1"})
        assert ck.id.startswith("ckp-") and ck.sandbox == sb.id and ck.files >= 1 and ck.sha256
        assert [c.id for c in await q.checkpoints.list(labels={"step": "1"})] == [ck.id]
        assert (await q.checkpoints.get(ck.id)).size_bytes == ck.size_bytes

        await sb.files.write("w/keep.txt", "v2")
        await sb.files.write("w/new.txt", "made after")
        res = await sb.restore(ck)
        assert res.checkpoint == ck.id and res.files >= 1
        assert await sb.files.read_text("w/keep.txt") == "v1"
        assert not await sb.files.exists("w/new.txt")

        async with q.sandboxes.create(from_checkpoint=ck.id) as restored:
            assert restored.id != sb.id
            assert await restored.files.read_text("w/keep.txt") == "v1"

        fr = await sb.fork(2, labels={"fork": "yes"})
        assert len(fr.sandboxes) == 2 and not fr.errors
        for f in fr.sandboxes:
            assert f.info.labels == {"fork": "yes"}
            assert (await f.exec("cat w/keep.txt")).stdout == "v1"
            await f.release()
        with pytest.raises(errors.NotFound):  # not kept
            await q.checkpoints.get(fr.checkpoint.id)

        await q.checkpoints.delete(ck)
        await q.checkpoints.delete(ck)  # again: fine
        with pytest.raises(errors.NotFound):
            await sb.restore(ck.id)
        with pytest.raises(errors.NotFound):
            await sb.checkpoint(["no/such/path"])
        with pytest.raises(errors.BadRequest) as bi:
            await sb.fork(0)
        assert bi.value.field == "count"

    async with AsyncQuarry(gw.url, gw.key) as q, q.sandboxes.create(pool="tiny") as only:
        fr = await only.fork(1)  # the pool has no room left
        assert len(fr.errors) == 1 and isinstance(fr.errors[0], errors.NoCapacity) and fr.errors[0].status == 503


@aio
async def test_checkpoint_over_budget_is_quota_exceeded(bin_dir: Path) -> None:
    g = Gateway(bin_dir, min_warm=1, max_total=4, env={"QUARRY_CHECKPOINT_BUDGET_PER_KEY": str(64 << 10)})
    try:
        async with AsyncQuarry(g.url, g.key) as q, q.sandboxes.create() as sb:
            await sb.files.write("w/big.bin", os.urandom(100 << 10))
            with pytest.raises(errors.QuotaExceeded) as qi:
                await sb.checkpoint(["w"])
            e = qi.value
            assert (e.status, e.code) == (429, "quota_exceeded") and e.retry_after is None
            assert "this API key's checkpoints take 0 B of the 64.0 KiB allowed" in e.message
            assert "QUARRY_CHECKPOINT_BUDGET_PER_KEY=65536" in e.message
            assert await q.checkpoints.list() == []  # nothing kept
            await sb.files.write("w/big.bin", b"small now")
            ck = await sb.checkpoint(["w"])
            assert ck.size_bytes < 64 << 10
    finally:
        g.stop()


@aio
async def test_relay_calls_respond_stream_and_transcript(gw: Gateway, sandbox_pythonpath: str) -> None:
    async with AsyncQuarry(gw.url, gw.key) as q, q.sandboxes.create(labels={"relay": "t"}) as sb:
        await sb.files.write_text("agent.py", AGENT)
        env = {"PYTHONPATH": sandbox_pythonpath}
        plain = asyncio.create_task(sb.exec("python3 agent.py plain hello", env=env, timeout=60))
        streamed = asyncio.create_task(sb.exec("python3 agent.py stream world", env=env, timeout=60))
        answered = 0
        async for call in q.model.calls(max=2, labels={"relay": "t"}):
            assert isinstance(call, ModelCall) and call.sandbox_id == sb.id and call.route == "chat/completions"
            prompt = call.messages[-1]["content"]
            if call.stream:
                await call.respond_stream([chunk("re: "), chunk(prompt), chunk(None, "stop")])
            else:
                await call.respond(completion("re: " + prompt))
            with pytest.raises(errors.Conflict):
                await call.respond(completion("twice"))
            answered += 1
            if answered == 2:
                break
        r1, r2 = await plain, await streamed
        assert (r1.stdout, r2.stdout) == ("re: hello\n", "re: world\n"), (r1.stderr, r2.stderr)

        ex = await sb.model.transcript()
        assert len(ex) == 2 and {e.state for e in ex} == {"answered"} and {e.stream for e in ex} == {True, False}
        assert all(e.request["messages"][0]["content"] in ("hello", "world") for e in ex)

        # serve: a sync handler, an async one returning chunks, and one that fails (a 500 for the agent).
        async def policy(call: ModelCall) -> Any:
            p = call.messages[-1]["content"]
            if p == "boom":
                raise RuntimeError("policy broke")
            if call.stream:
                return [chunk("s:" + p), chunk(None, "stop")]
            return completion("j:" + p)
        runs = [sb.exec(f"python3 agent.py {mode} {p}", env=env, timeout=60)
                for mode, p in (("plain", "a"), ("stream", "b"), ("plain", "boom"))]
        served = asyncio.create_task(q.model.serve(policy, concurrency=4, labels={"relay": "t"}, max_calls=3))
        results = await asyncio.gather(*runs)
        assert await served == 3
        assert results[0].stdout == "j:a\n" and results[1].stdout == "s:b\n"
        assert results[2].exit_code != 0 and "policy broke" in results[2].stderr

        def sync_policy(call: ModelCall) -> dict[str, Any]:
            return completion("sync:" + call.messages[-1]["content"])
        run = sb.exec("python3 agent.py plain c", env=env, timeout=60)
        served = asyncio.create_task(q.model.serve(sync_policy, labels={"relay": "t"}, max_calls=1))
        assert (await run).stdout == "sync:c\n"
        await served

        with pytest.raises(errors.NotFound):
            await ModelCall(q._t, {"id": "mrq-" + "a" * 32}).respond(completion("x"))
        with pytest.raises(errors.BadRequest):
            run = asyncio.create_task(sb.exec("python3 agent.py plain d", env=env, timeout=60))
            (call,) = [c async for c in q.model.calls(labels={"relay": "t"}, limit=1)]
            try:
                await call.respond({"no": "choices"})
            finally:
                await call.respond(completion("ok"))
                await run


class FakeOpenAI(BaseHTTPRequestHandler):
    """An OpenAI-compatible server (as vLLM is) for the adapter's test."""

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = f"upstream saw {body['model']}: {body['messages'][-1]['content']}"
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for c in (chunk(text), chunk(None, "stop")):
                self.wfile.write(b"data: " + json.dumps(c).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
            return
        out = json.dumps(completion(text)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a: Any) -> None:
        pass


@pytest.fixture
def fake_openai() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


@aio
async def test_openai_adapter_forwards_to_an_upstream(gw: Gateway, sandbox_pythonpath: str, fake_openai: str) -> None:
    from quarry.openai_adapter import OpenAIForwarder
    async with AsyncQuarry(gw.url, gw.key) as q, q.sandboxes.create(labels={"relay": "fwd"}) as sb:
        await sb.files.write_text("agent.py", AGENT)
        env = {"PYTHONPATH": sandbox_pythonpath}
        runs = [sb.exec("python3 agent.py plain x", env=env, timeout=60),
                sb.exec("python3 agent.py stream y", env=env, timeout=60)]
        fwd = OpenAIForwarder(base_url=fake_openai, api_key="k", model="served-model")
        served = asyncio.create_task(q.model.serve(fwd, labels={"relay": "fwd"}, max_calls=2))
        a, b = await asyncio.gather(*runs)
        await served
        assert a.stdout == "upstream saw served-model: x\n", a.stderr
        assert b.stdout == "upstream saw served-model: y\n", b.stderr


@aio
async def test_envs(gw: Gateway) -> None:
    async with AsyncQuarry(gw.url, gw.key) as q:
        assert {"guess", "terminal"} <= {e.id for e in await q.envs.list()}
        async with q.envs.make("guess") as env:
            with pytest.raises(errors.EpisodeNotRunning):
                await env.step(50)
            obs, info = await env.reset(seed=7, options={"low": 1, "high": 8, "max_guesses": 8})
            assert "between 1 and 8" in obs and info["high"] == 8
            with pytest.raises(errors.InvalidAction):
                await env.step("not a number")
            reward, terminated, truncated = 0.0, False, False
            for guess in range(1, 9):
                obs, reward, terminated, truncated, info = await env.step(guess)
                if terminated:
                    break
            assert terminated and reward == 1.0 and not truncated
        with pytest.raises(errors.Gone):  # close released its sandbox
            await env.sandbox.exec("true")
        with pytest.raises(errors.BadRequest) as bi:
            await q.envs.make("no-such-env")
        assert bi.value.field == "env_id"
        async with q.sandboxes.create() as plain:
            with pytest.raises(errors.Conflict):
                await q.envs.attach("guess", plain.id).step(1)


def test_gymnasium_env(gw: Gateway) -> None:
    import gymnasium

    from quarry.gym import make
    with quarry.Quarry(gw.url, gw.key) as q:
        env = make(q, "guess")
        assert isinstance(env, gymnasium.Env)
        obs, info = env.reset(seed=3, options={"low": 1, "high": 4, "max_guesses": 4})
        assert "between 1 and 4" in obs
        done = False
        for g in range(1, 5):
            obs, reward, terminated, truncated, info = env.step(g)
            if terminated:
                done = True
                break
        assert done and reward == 1.0
        env.close()
