"""E2B's unmodified Python SDK against Quarry, written as an E2B user writes it.

tests/e2b_sdk_test.go runs this file with each pinned SDK version's python (scripts/e2b-sdk.sh) and
with nothing but E2B's own environment variables pointing the SDK at a Quarry gateway:

  E2B_API_URL, E2B_API_KEY, and E2B_SANDBOX_URL (routing by headers) or E2B_DOMAIN (routing by
  host: https://49983-{id}.{domain}, with SSL_CERT_FILE naming the test CA).

Two variables are the harness's, not the SDK's: QUARRY_E2B_TEMPLATE (the pool to create from) and
QUARRY_E2B_ROUTING ("headers" or "hosts": signed file URLs and get_host need the host form), and,
on Docker, QUARRY_E2B_SMALL_DISK_TEMPLATE (a pool whose work directory holds 25 MiB) and
QUARRY_E2B_PAUSE=1 (the provider pauses sandboxes).

A test that needs a method this SDK version does not have is skipped with the reason
"not in e2b <version>"; the Go side allows no other skip.
"""

import asyncio
import os
import sys
import threading
import time
import unittest
import urllib.request
import uuid
from importlib.metadata import version as dist_version

from e2b import (
    AsyncSandbox,
    CommandExitException,
    Sandbox,
    SandboxQuery,
    SandboxState,
)
from e2b.exceptions import (
    AuthenticationException,
    NotEnoughSpaceException,
    NotFoundException,
    SandboxException,
    TimeoutException,
)
from e2b.sandbox.commands.command_handle import PtySize

SDK = dist_version("e2b")
TEMPLATE = os.environ["QUARRY_E2B_TEMPLATE"]
ROUTING = os.environ["QUARRY_E2B_ROUTING"]
RUN = uuid.uuid4().hex[:8]  # this run's metadata, so that listing sees only its own sandboxes


def needs(obj, name):
    """Skips the test unless this SDK version has obj.name."""
    if not hasattr(obj, name):
        raise unittest.SkipTest(f"not in e2b {SDK}: {type(obj).__name__}.{name}")


def until(what, check, timeout=30.0):
    """Waits for check() to be true, polling, for at most timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


class Base(unittest.TestCase):
    def create(self, **kw):
        kw.setdefault("timeout", 300)
        meta = {"suite": RUN, "case": self._testMethodName}
        meta.update(kw.pop("metadata", {}))
        sbx = Sandbox.create(TEMPLATE, metadata=meta, **kw)
        self.addCleanup(sbx.kill)
        return sbx


class Lifecycle(Base):
    def test_create_connect_list_timeout_info_kill(self):
        sbx = self.create(metadata={"owner": "alice"}, envs={"GREETING": "hello"}, timeout=120)
        self.assertTrue(sbx.is_running())
        self.assertEqual(sbx.commands.run("echo $GREETING").stdout.strip(), "hello")

        info = sbx.get_info()
        self.assertEqual(info.sandbox_id, sbx.sandbox_id)
        self.assertEqual(info.metadata.get("owner"), "alice")
        left = (info.end_at - info.started_at).total_seconds()
        self.assertTrue(100 <= left <= 130, f"the lease runs {left}s, asked 120")

        again = Sandbox.connect(sbx.sandbox_id)
        self.assertEqual(again.sandbox_id, sbx.sandbox_id)
        self.assertEqual(again.commands.run("echo $GREETING").stdout.strip(), "hello")

        other = self.create(metadata={"owner": "bob"})
        listed = Sandbox.list(query=SandboxQuery(metadata={"suite": RUN, "owner": "alice"}))
        ids = [s.sandbox_id for s in listed.next_items()]
        self.assertIn(sbx.sandbox_id, ids)
        self.assertNotIn(other.sandbox_id, ids)

        sbx.set_timeout(30)
        end = sbx.get_info().end_at.timestamp()
        self.assertTrue(end - time.time() <= 35, f"set_timeout(30) left {end - time.time()}s")

        self.assertTrue(sbx.kill())
        self.assertFalse(sbx.is_running())
        self.assertFalse(Sandbox.kill(sbx.sandbox_id), "a second kill finds nothing")
        with self.assertRaises(SandboxException):
            Sandbox.connect(sbx.sandbox_id)

    def test_wrong_key_is_refused(self):
        with self.assertRaises(AuthenticationException):
            Sandbox.create(TEMPLATE, api_key="e2b_" + "0" * 40)


class Commands(Base):
    @classmethod
    def setUpClass(cls):
        cls.sbx = Sandbox.create(TEMPLATE, metadata={"suite": RUN, "case": "commands"}, timeout=300)

    @classmethod
    def tearDownClass(cls):
        cls.sbx.kill()

    def test_foreground_env_cwd_user_output(self):
        self.sbx.files.make_dir("sub")
        out, err = [], []
        res = self.sbx.commands.run(
            'echo "$A $B"; pwd; echo oops >&2',
            envs={"A": "1", "B": "two"},
            cwd=self.sbx.commands.run("pwd").stdout.strip() + "/sub",
            user="user",
            on_stdout=out.append,
            on_stderr=err.append,
            timeout=30,
        )
        self.assertEqual(res.exit_code, 0)
        lines = res.stdout.splitlines()
        self.assertEqual(lines[0], "1 two")
        self.assertTrue(lines[1].endswith("/sub"), lines)
        self.assertEqual(res.stderr.strip(), "oops")
        self.assertEqual("".join(out), res.stdout)
        self.assertEqual("".join(err), res.stderr)

    def test_nonzero_exit_raises_with_its_code(self):
        with self.assertRaises(CommandExitException) as cm:
            self.sbx.commands.run("echo partial; exit 7")
        self.assertEqual(cm.exception.exit_code, 7)
        self.assertEqual(cm.exception.stdout.strip(), "partial")

    def test_timeout_ends_the_command(self):
        t0 = time.monotonic()
        with self.assertRaises(TimeoutException):
            self.sbx.commands.run("sleep 30", timeout=1)
        self.assertLess(time.monotonic() - t0, 20)

    def test_background_list_connect_kill(self):
        h = self.sbx.commands.run("echo started; sleep 600", background=True)
        until("the process is listed", lambda: h.pid in [p.pid for p in self.sbx.commands.list()])
        again = self.sbx.commands.connect(h.pid)
        self.assertTrue(self.sbx.commands.kill(h.pid))
        with self.assertRaises(CommandExitException):
            again.wait()
        until("the process is gone", lambda: h.pid not in [p.pid for p in self.sbx.commands.list()])

    def test_background_wait(self):
        h = self.sbx.commands.run("sleep 0.2; echo done", background=True)
        res = h.wait()
        self.assertEqual(res.stdout.strip(), "done")

    def test_stdin(self):
        h = self.sbx.commands.run("cat", background=True, stdin=True)
        self.sbx.commands.send_stdin(h.pid, "line one\n")
        needs(self.sbx.commands, "close_stdin")
        self.sbx.commands.close_stdin(h.pid)
        res = h.wait()
        self.assertEqual(res.stdout, "line one\n")


class Pty(Base):
    def test_create_input_resize_kill(self):
        sbx = self.create()
        data = bytearray()
        lock = threading.Lock()

        def on_data(b):
            with lock:
                data.extend(b)

        h = sbx.pty.create(PtySize(rows=24, cols=80), timeout=60)
        # The sync SDK reads a PTY's output in wait(), which a user runs in a thread.
        ended = []

        def reader():
            try:
                h.wait(on_pty=on_data)
            except CommandExitException as e:
                ended.append(e)

        th = threading.Thread(target=reader, daemon=True)
        th.start()
        sbx.pty.send_stdin(h.pid, b"stty size; echo pty-$((40+2))\n")
        until("the PTY echoes", lambda: b"pty-42" in bytes(data))
        self.assertIn(b"24 80", bytes(data))
        sbx.pty.resize(h.pid, PtySize(rows=30, cols=100))
        sbx.pty.send_stdin(h.pid, b"stty size\n")
        until("the new size", lambda: b"30 100" in bytes(data))
        self.assertTrue(sbx.pty.kill(h.pid))
        th.join(30)
        self.assertFalse(th.is_alive(), "wait() returns once the PTY is killed")
        self.assertEqual(len(ended), 1, "a killed PTY's wait raises CommandExitException")


class Files(Base):
    @classmethod
    def setUpClass(cls):
        cls.sbx = Sandbox.create(TEMPLATE, metadata={"suite": RUN, "case": "files"}, timeout=300)

    @classmethod
    def tearDownClass(cls):
        cls.sbx.kill()

    def test_write_read_text_bytes_stream(self):
        fs = self.sbx.files
        fs.write("notes/a.txt", "héllo\n")
        self.assertEqual(fs.read("notes/a.txt"), "héllo\n")
        blob = bytes(range(256)) * 1024
        fs.write("notes/b.bin", blob)
        self.assertEqual(bytes(fs.read("notes/b.bin", format="bytes")), blob)
        streamed = b"".join(fs.read("notes/b.bin", format="stream"))
        self.assertEqual(streamed, blob)

    def test_write_many_list_exists_info(self):
        fs = self.sbx.files
        needs(fs, "write_files")
        from e2b.sandbox.filesystem.filesystem import WriteEntry

        fs.write_files([WriteEntry(path=f"many/f{i}.txt", data=f"n{i}") for i in range(5)])
        names = sorted(e.name for e in fs.list("many"))
        self.assertEqual(names, [f"f{i}.txt" for i in range(5)])
        self.assertTrue(fs.exists("many/f3.txt"))
        self.assertFalse(fs.exists("many/nope.txt"))
        info = fs.get_info("many/f3.txt")
        self.assertEqual(info.size, 2)
        self.assertEqual(info.type.value, "file")

    def test_make_dir_rename_remove(self):
        fs = self.sbx.files
        self.assertTrue(fs.make_dir("d1/d2"))
        self.assertFalse(fs.make_dir("d1/d2"), "make_dir answers False for a directory that exists")
        fs.write("d1/d2/x", "x")
        fs.rename("d1/d2/x", "d1/y")
        self.assertFalse(fs.exists("d1/d2/x"))
        self.assertEqual(fs.read("d1/y"), "x")
        fs.remove("d1")
        self.assertFalse(fs.exists("d1"))

    def test_missing_file_is_not_found(self):
        with self.assertRaises(NotFoundException):
            self.sbx.files.read("no/such/file")

    def test_watch_dir(self):
        fs = self.sbx.files
        fs.make_dir("watched")
        w = fs.watch_dir("watched")
        try:
            fs.write("watched/new.txt", "1")
            seen = []
            until("the write's event", lambda: seen.extend(w.get_new_events()) or any(e.name == "new.txt" for e in seen))
        finally:
            w.stop()

    def test_signed_urls(self):
        if ROUTING != "hosts":
            self.skipTest("signed file URLs name no sandbox under E2B_SANDBOX_URL (docs/E2B.md): the hosts run covers them")
        sbx = self.create()
        sbx.files.write("dl.txt", "download me")
        url = sbx.download_url("dl.txt")
        with urllib.request.urlopen(url, timeout=30) as r:
            self.assertEqual(r.read(), b"download me")
        up = sbx.upload_url("up.txt")
        boundary = "qb" + uuid.uuid4().hex
        body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"up.txt\"\r\n"
                f"Content-Type: application/octet-stream\r\n\r\nuploaded\r\n--{boundary}--\r\n").encode()
        req = urllib.request.Request(up, data=body, method="POST",
                                     headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            self.assertEqual(r.status, 200)
        self.assertEqual(sbx.files.read("up.txt"), "uploaded")


class ForkAndSnapshot(Base):
    def test_snapshot_then_create_from_it(self):
        sbx = self.create()
        needs(sbx, "create_snapshot")
        sbx.files.write("state.txt", "v1")
        snap = sbx.create_snapshot()
        sid = snap.snapshot_id
        sbx.files.write("state.txt", "v2")
        restored = Sandbox.create(sid, metadata={"suite": RUN}, timeout=120)
        self.addCleanup(restored.kill)
        self.assertEqual(restored.files.read("state.txt"), "v1")
        self.assertIn(sid, [s.snapshot_id for s in Sandbox.list_snapshots().next_items()])
        self.assertTrue(Sandbox.delete_snapshot(sid))

    def test_fork(self):
        sbx = self.create()
        needs(sbx, "fork")
        sbx.files.write("state.txt", "parent")
        forks = sbx.fork(count=2)
        self.assertEqual(len(forks), 2)
        for f in forks:
            self.assertIsInstance(f, Sandbox, f)
            self.addCleanup(f.kill)
        a, b = forks
        self.assertEqual(a.files.read("state.txt"), "parent")
        a.files.write("state.txt", "a")
        self.assertEqual(b.files.read("state.txt"), "parent")
        self.assertEqual(sbx.files.read("state.txt"), "parent")


class KilledSandbox(Base):
    def test_calls_on_a_killed_sandbox_end(self):
        sbx = self.create()
        h = sbx.commands.run("sleep 600", background=True)
        Sandbox.kill(sbx.sandbox_id)
        t0 = time.monotonic()
        with self.assertRaises(Exception):
            h.wait()
        with self.assertRaises(SandboxException):
            sbx.commands.run("true", request_timeout=30)
        with self.assertRaises(SandboxException):
            sbx.files.read("x", request_timeout=30)
        self.assertLess(time.monotonic() - t0, 60, "calls on a killed sandbox end")
        self.assertFalse(sbx.is_running())


class Pause(Base):
    def test_pause_then_connect_resumes_with_processes_and_files(self):
        sbx = self.create()
        needs(sbx, "pause")
        if os.environ.get("QUARRY_E2B_PAUSE") != "1":
            with self.assertRaises(Exception) as cm:
                sbx.pause()
            self.assertIn("cannot pause", str(cm.exception))
            self.assertEqual(sbx.commands.run("echo running").stdout, "running\n", "a refused pause leaves it running")
            return
        sbx.files.write("kept.txt", "kept")
        h = sbx.commands.run("sleep 600", background=True)
        self.assertTrue(sbx.pause())
        self.assertFalse(sbx.pause(), "a second pause: already paused")
        self.assertEqual(sbx.get_info().state.value, "paused")
        ids = [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"suite": RUN}, state=[SandboxState.PAUSED])).next_items()]
        self.assertIn(sbx.sandbox_id, ids)
        with self.assertRaises(SandboxException):
            sbx.commands.run("true", request_timeout=30)
        again = Sandbox.connect(sbx.sandbox_id)
        self.assertEqual(again.get_info().state.value, "running")
        self.assertEqual(again.files.read("kept.txt"), "kept")
        self.assertIn(h.pid, [p.pid for p in again.commands.list()], "its processes live on")
        self.assertEqual(again.commands.run("echo back").stdout, "back\n")


class FullDisk(Base):
    def test_full_disk_is_not_enough_space_and_the_sandbox_lives(self):
        small = os.environ.get("QUARRY_E2B_SMALL_DISK_TEMPLATE")
        if not small:
            self.skipTest("no disk quota on this provider: the Docker run covers it")
        sbx = Sandbox.create(small, metadata={"suite": RUN}, timeout=120)
        self.addCleanup(sbx.kill)
        chunk = b"x" * 10_000_000
        sbx.files.write("a.bin", chunk)
        sbx.files.write("b.bin", chunk)
        with self.assertRaises(NotEnoughSpaceException):
            sbx.files.write("c.bin", chunk)
        self.assertEqual(sbx.commands.run("echo alive").stdout, "alive\n")
        sbx.files.remove("b.bin")
        sbx.files.write("c.bin", b"fits now")
        self.assertEqual(sbx.files.read("c.bin"), "fits now")


class Async(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.sbx = await AsyncSandbox.create(TEMPLATE, metadata={"suite": RUN, "case": "async"},
                                             envs={"GREETING": "hi"}, timeout=120)

    async def asyncTearDown(self):
        await self.sbx.kill()

    async def test_commands(self):
        out = []
        res = await self.sbx.commands.run("echo $GREETING; echo e >&2", on_stdout=out.append)
        self.assertEqual(res.stdout, "hi\n")
        self.assertEqual(res.stderr, "e\n")
        self.assertEqual("".join(out), "hi\n")
        with self.assertRaises(CommandExitException) as cm:
            await self.sbx.commands.run("exit 3")
        self.assertEqual(cm.exception.exit_code, 3)
        h = await self.sbx.commands.run("sleep 0.2; echo bg", background=True)
        self.assertEqual((await h.wait()).stdout, "bg\n")
        info = await self.sbx.get_info()
        self.assertEqual(info.metadata.get("case"), "async")
        again = await AsyncSandbox.connect(self.sbx.sandbox_id)
        self.assertTrue(await again.is_running())

    async def test_files_and_watch(self):
        fs = self.sbx.files
        await fs.make_dir("w")
        events = []
        got = asyncio.Event()

        def on_event(e):
            events.append(e)
            if e.name == "f.txt":
                got.set()

        w = await fs.watch_dir("w", on_event)
        try:
            await fs.write("w/f.txt", "async")
            await asyncio.wait_for(got.wait(), 30)
        finally:
            await w.stop()
        self.assertEqual(await fs.read("w/f.txt"), "async")
        self.assertEqual([e.name for e in await fs.list("w")], ["f.txt"])

    async def test_pty(self):
        data = bytearray()
        h = await self.sbx.pty.create(PtySize(rows=24, cols=80), on_data=data.extend, timeout=60)
        await self.sbx.pty.send_stdin(h.pid, b"echo async-$((1+1))\n")
        for _ in range(600):
            if b"async-2" in bytes(data):
                break
            await asyncio.sleep(0.05)
        self.assertIn(b"async-2", bytes(data))
        self.assertTrue(await self.sbx.pty.kill(h.pid))


if __name__ == "__main__":
    result = unittest.main(verbosity=2, exit=False).result
    # The Go side checks every skip's reason.
    for case, reason in result.skipped:
        print(f"SKIP {case.id()}: {reason}")
    sys.exit(0 if result.wasSuccessful() else 1)
