"""Sandboxes, exec, sessions, processes, files, keep-alive and their errors,
against the real gateway."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from pathlib import Path

import pytest
from conftest import aio
from gateway import Gateway

import quarry
from quarry import AsyncQuarry, errors


def client(gw: Gateway, key: str | None = None) -> AsyncQuarry:
    return AsyncQuarry(gw.url, key or gw.key)


@aio
async def test_create_exec_list_get_heartbeat_release(gw: Gateway) -> None:
    async with client(gw) as q:
        sb = await q.sandboxes.create(pool="default", env={"TASK": "42"}, labels={"run": "t1"}, lease_seconds=120)
        assert sb.id.startswith("sbx-") and sb.info.state == "active" and sb.info.lease_seconds == 120
        r = await sb.exec("echo $TASK; echo err >&2; exit 3")
        assert (r.exit_code, r.stdout, r.stderr, r.ok) == (3, "42\n", "err\n", False)
        r = await sb.exec(["sh", "-c", "pwd; echo $X"], env={"X": "y"}, cwd="/tmp")
        assert r.stdout == "/tmp\ny\n" and r.ok
        r = await sb.exec("cat", stdin=b"\x00\xffbytes", binary=True)
        assert r.stdout == b"\x00\xffbytes"
        r = await sb.exec("sleep 5", timeout=0.3)
        assert r.timed_out and r.exit_code == -1 and r.signal == "SIGKILL"

        listed = await q.sandboxes.list(labels={"run": "t1"})
        assert [s.id for s in listed] == [sb.id]
        got = await q.sandboxes.get(sb.id)
        assert got.info.labels == {"run": "t1"}
        before = sb.info.expires_at
        await asyncio.sleep(1.1)
        hb = await sb.heartbeat()
        assert before is not None and hb.expires_at is not None and hb.expires_at > before

        rel = await sb.release()
        assert rel.state == "released"
        with pytest.raises(errors.Gone) as ei:
            await sb.exec("true")
        assert ei.value.status == 410 and ei.value.state == "released"
        assert isinstance(ei.value.ended_at, dt.datetime) and ei.value.sandbox_id == sb.id
        with pytest.raises(errors.Gone):
            await sb.release()


@aio
async def test_context_manager_releases(gw: Gateway) -> None:
    async with client(gw) as q:
        async with q.sandboxes.create() as sb:
            assert (await sb.exec("true")).ok
        assert (await sb.refresh()).state == "released"
        async with await q.sandboxes.create() as sb2:
            await sb2.release()  # ended inside: the exit is fine with that
        assert sb2.info.state == "released"


@aio
async def test_exec_stream(gw: Gateway) -> None:
    async with client(gw) as q, q.sandboxes.create() as sb:
        events = [e async for e in sb.exec_stream("echo one; sleep 0.2; echo two >&2; exit 7")]
        out = "".join(e.data for e in events if e.type == "stdout")
        err = "".join(e.data for e in events if e.type == "stderr")
        assert (out, err) == ("one\n", "two\n")
        assert events[-1].type == "exit" and events[-1].result is not None and events[-1].result.exit_code == 7
        bevents = [e async for e in sb.exec_stream("printf '\\001\\002'", binary=True)]
        assert b"".join(e.data for e in bevents if e.type == "stdout") == b"\x01\x02"
        with pytest.raises(errors.BadRequest) as ei:
            async for _ in sb.exec_stream("true", max_output_bytes=1 << 40):
                pass
        assert ei.value.field == "max_output_bytes"

        # A stream cut by the lease's end raises Gone with how it ended.
        async def release_soon() -> None:
            await asyncio.sleep(0.5)
            await q.sandboxes.attach(sb.id).release()
        task = asyncio.create_task(release_soon())
        with pytest.raises(errors.Gone) as gi:
            async for _ in sb.exec_stream("sleep 30"):
                pass
        await task
        assert gi.value.state == "released"


@aio
async def test_sessions(gw: Gateway) -> None:
    async with client(gw) as q, q.sandboxes.create() as sb:
        async with sb.session(env={"A": "1"}) as s:
            r = await s.run("cd /tmp && export B=2")
            assert r.exit_code == 0
            r = await s.run("pwd; echo $A$B")
            assert r.output == "/tmp\n12\n"
            assert [x.id for x in await sb.sessions()] == [s.id]
            slow = asyncio.create_task(s.run("sleep 1.5"))
            await asyncio.sleep(0.4)
            with pytest.raises(errors.Busy) as bi:
                await s.run("true")
            assert bi.value.status == 409 and isinstance(bi.value, errors.Conflict)
            assert (await slow).exit_code == 0
            r = await s.run("sleep 3", timeout=0.3)
            assert r.timed_out and r.exit_code != 0
        with pytest.raises(errors.NotFound):
            await s.run("true")


@aio
async def test_processes(gw: Gateway) -> None:
    async with client(gw) as q, q.sandboxes.create() as sb:
        p = await sb.start_process("echo start; read line; echo got $line; exit 4", stdin=True)
        assert p.info.running
        n = await p.write_stdin("hello\n")
        assert n == 6
        chunks = [c async for c in p.follow()]
        assert "".join(chunks) == "start\ngot hello\n"
        assert p.info.exit_code == 4 and p.info.state == "exited"
        out = await p.output(offset=6)
        assert out.data == "got hello\n"
        assert any(x.id == p.id for x in await sb.processes())

        s = await sb.start_process("trap 'echo term; exit 9' TERM; while true; do sleep 0.05; done", name="looper")
        with pytest.raises(errors.NameInUse):
            await sb.start_process("sleep 10", name="looper")
        await asyncio.sleep(0.3)
        await s.signal("TERM")
        info = await s.wait(timeout=10)
        assert info.exit_code == 9
        await s.kill()
        with pytest.raises(errors.NotFound):
            await sb.process(s.id).refresh()

        c = await sb.start_process("cat > /dev/null", stdin=True)
        await c.close_stdin()
        assert (await c.wait(timeout=10)).exit_code == 0

        rpc = await sb.start_process(["python3", "-u", "-c",
                                      "import sys, json\nfor l in sys.stdin:\n"
                                      " d = json.loads(l)\n if d == 'quit': break\n"
                                      " print(json.dumps({'echo': d}), flush=True)"], rpc=True, name="echo")
        assert await sb.process("echo").call({"x": 1}) == {"echo": {"x": 1}}
        with pytest.raises((errors.NoReply, errors.ProcessExited)):
            await rpc.call("quit")
        await rpc.wait(timeout=10)
        with pytest.raises(errors.ProcessExited):
            await rpc.call({"y": 2})
        with pytest.raises(errors.NotFound):
            await sb.process("nope").refresh()
        with pytest.raises(asyncio.TimeoutError):
            await (await sb.start_process("sleep 5")).wait(timeout=0.3)


@aio
async def test_files(gw: Gateway, tmp_path: Path) -> None:
    async with client(gw) as q, q.sandboxes.create() as sb:
        w = await sb.files.write("d/a.bin", b"\x00\x01\x02", mode=0o600)
        assert w.bytes == 3 and w.path.endswith("d/a.bin")
        assert await sb.files.read("d/a.bin") == b"\x00\x01\x02"
        assert await sb.files.read("d/a.bin", offset=1, length=1) == b"\x01"
        await sb.files.write_text("d/t.txt", "héllo")
        assert await sb.files.read_text("d/t.txt") == "héllo"
        st = await sb.files.stat("d/a.bin")
        assert st.size == 3 and not st.is_dir and st.mode.endswith("600")
        assert sorted(e.name for e in await sb.files.list("d")) == ["a.bin", "t.txt"]
        with pytest.raises(errors.Conflict):
            await sb.files.write("d/t.txt", "x", exclusive=True)
        await sb.files.delete("d/t.txt")
        assert not await sb.files.exists("d/t.txt")
        with pytest.raises(errors.NotFound):
            await sb.files.read("d/t.txt")
        with pytest.raises(errors.BadRequest) as bi:
            await sb.files.delete("d")  # not empty
        assert bi.value.status == 400
        with pytest.raises(errors.PayloadTooLarge) as pi:
            await sb.files.write("big", b"x" * (9 << 20))  # over the test gateway's 8 MiB
        assert pi.value.status == 413

        src = tmp_path / "src"
        (src / "sub").mkdir(parents=True)
        (src / "top.txt").write_text("top")
        (src / "sub" / "x.py").write_text("print(1)")
        os.chmod(src / "sub" / "x.py", 0o755)
        up = await sb.files.upload_dir(src, "proj")
        assert up.entries >= 3
        assert (await sb.exec("cat proj/top.txt proj/sub/x.py")).stdout == "topprint(1)"
        names = await sb.files.download_dir("proj", tmp_path / "back")
        assert "top.txt" in [n.lstrip("./") for n in names]
        assert (tmp_path / "back" / "sub" / "x.py").read_text() == "print(1)"
        assert os.stat(tmp_path / "back" / "sub" / "x.py").st_mode & 0o777 == 0o755
        with pytest.raises(ValueError):
            await sb.files.read("")


@aio
async def test_keep_alive(gw: Gateway) -> None:
    async with client(gw) as q:
        kept = await q.sandboxes.create(lease_seconds=3, keep_alive=True)  # renews every second
        plain = await q.sandboxes.create(lease_seconds=3)
        await asyncio.sleep(5)
        assert (await kept.refresh()).state == "active"
        with pytest.raises(errors.Gone) as gi:
            await plain.exec("true")
        assert gi.value.state == "expired"
        await kept.release()
        assert kept._keep_alive is None


@aio
async def test_errors_of_the_gateway(gw: Gateway) -> None:
    async with client(gw) as q:
        with pytest.raises(errors.NotFound) as ni:
            await q.sandboxes.get("sbx-nope")
        assert ni.value.status == 404 and ni.value.code == "not_found"
        with pytest.raises(errors.BadRequest) as bi:
            await q.sandboxes.create(lease_seconds=999999)
        assert bi.value.field == "lease_seconds"
        with pytest.raises(errors.BadRequest) as pi:
            await q.sandboxes.create(pool="no-such-pool")
        assert pi.value.field == "pool"
        async with q.sandboxes.create() as sb:
            async with client(gw, gw.other_key) as other:  # another tenant's sandbox is not there
                with pytest.raises(errors.NotFound):
                    await other.sandboxes.get(sb.id)
                assert sb.id not in [s.id for s in await other.sandboxes.list()]
    async with AsyncQuarry(gw.url, "wrong-key") as bad:
        with pytest.raises(errors.Unauthorized) as ui:
            await bad.sandboxes.list()
        assert ui.value.status == 401


def test_sync_client(gw: Gateway) -> None:
    with quarry.Quarry(gw.url, gw.key) as q:
        assert any(p.name == "default" for p in q.pools())
        with q.sandboxes.create(labels={"sync": "1"}) as sb:
            assert sb.exec("echo hi").stdout == "hi\n"
            assert [e.type for e in sb.exec_stream("echo a")][-1] == "exit"
            with sb.session() as s:
                assert s.run("echo $((1+2))").output == "3\n"
            p = sb.start_process("echo out")
            assert "".join(p.follow()) == "out\n"
            sb.files.write("f.txt", b"sync")
            assert sb.files.read("f.txt") == b"sync"
            assert [x.id for x in q.sandboxes.list(labels={"sync": "1"})] == [sb.id]
        with pytest.raises(errors.Gone):
            sb.exec("true")
        with pytest.raises(errors.NotFound):
            q.sandboxes.get("sbx-missing")
