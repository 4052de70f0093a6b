"""Sandboxes and what runs in them: exec, sessions, processes, files,
checkpoints, keep-alive and the lease's model transcript (async; the sync
client wraps these same objects)."""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import os
import tarfile
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Generator, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, List, TypeVar

from . import errors
from ._http import COMMAND_MARGIN, CREATE_TIMEOUT, Transport, label_params, sandbox_path, seg
from .types import (
    Checkpoint, Exchange, ExecEvent, ExecResult, FileInfo, KillAllResult, ProcessInfo,
    ProcessOutput, RestoreResult, RunResult, SandboxInfo, SessionInfo, WriteResult, build,
    parse_time,
)

log = logging.getLogger("quarry")

_T = TypeVar("_T")

#: The agent's default command timeout (5 min) when a call names none.
AGENT_DEFAULT_TIMEOUT = 300.0


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else max(1, int(seconds * 1000))


def _command_timeout(timeout: float | None) -> float:
    return (AGENT_DEFAULT_TIMEOUT if timeout is None else timeout) + COMMAND_MARGIN


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def size(value: int | str | None, what: str) -> int | str | None:
    """A size as the gateway reads it: an int of MiB, or a string with a
    binary unit ("512Mi", "2Gi"), which the gateway parses (and refuses with
    a BadRequest naming the field)."""
    if value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise TypeError(f"{what}: want an int of MiB or a string such as \"2Gi\", got {type(value).__name__}")


def image_fields(image: str | None, class_: str | None, cpu: float | None, memory: int | str | None,
                 disk: int | str | None) -> dict[str, Any]:
    """The image, class and sizes of a create or a prefetch, None left out."""
    return _drop_none({"image": image, "class": class_, "cpu": cpu, "memory": size(memory, "memory"),
                       "disk": size(disk, "disk")})


class Sandbox:
    """A leased sandbox. Every call raises a :mod:`quarry.errors` class; a
    :class:`~quarry.errors.Gone` carries how the lease ended. ``async with``
    releases it on exit (a sandbox that ended already is fine)."""

    def __init__(self, t: Transport, info: SandboxInfo) -> None:
        self._t = t
        self.info = info
        self.id = info.id
        self.files = Files(self)
        self.model = SandboxModel(self)
        self._keep_alive: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r}, pool={self.info.pool!r}, state={self.info.state!r})"

    # -- calls -------------------------------------------------------------

    async def _json(self, method: str, *rest: str, **kw: Any) -> Any:
        try:
            return await self._t.json(method, sandbox_path(self.id, *rest), **kw)
        except errors.Gone as e:
            await self._explain(e)
            raise

    async def _explain(self, e: errors.Gone) -> None:
        """Fill e with the lease's end, read after the refusal (best effort)."""
        e.sandbox_id = self.id
        try:
            d = await self._t.json("GET", sandbox_path(self.id))
        except (errors.QuarryError, OSError, ValueError):
            return
        except Exception:  # httpx's own errors
            return
        info = build(SandboxInfo, d)
        self.info = info
        e.state, e.reason, e.ended_at = info.state, info.reason or None, info.ended_at

    # -- the lease ----------------------------------------------------------

    async def refresh(self) -> SandboxInfo:
        """GET the lease again (state, expires_at, ...)."""
        self.info = build(SandboxInfo, await self._json("GET"))
        return self.info

    async def heartbeat(self) -> SandboxInfo:
        """Extend the lease by its lease_seconds. Gone once it ended."""
        self.info = build(SandboxInfo, await self._json("POST", "heartbeat"))
        return self.info

    def keep_alive(self, interval: float | None = None) -> None:
        """Renew the lease in the background every interval seconds (default:
        a third of its lease_seconds) until :meth:`release` or
        :meth:`stop_keep_alive`. A failed renewal is logged and tried again at
        the next tick; the loop ends when the lease has ended (Gone)."""
        if self._keep_alive is not None and not self._keep_alive.done():
            return
        every = interval if interval is not None else max(1.0, (self.info.lease_seconds or 60) / 3)
        self._keep_alive = asyncio.get_running_loop().create_task(self._renew(every))

    async def _renew(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                await self.heartbeat()
            except errors.Gone:
                return
            except Exception as e:  # the next tick tries again
                log.warning("quarry: heartbeat of %s failed: %s", self.id, e)

    async def stop_keep_alive(self) -> None:
        task, self._keep_alive = self._keep_alive, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def release(self) -> SandboxInfo:
        """DELETE the lease (the task is stopped). Gone when it had ended already."""
        await self.stop_keep_alive()
        self.info = build(SandboxInfo, await self._json("DELETE"))
        return self.info

    close = release

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.release()
        except (errors.Gone, errors.NotFound):
            pass

    # -- commands -------------------------------------------------------------

    def _exec_body(self, cmd: str | Sequence[str], timeout: float | None, env: Mapping[str, str] | None,
                   cwd: str | None, stdin: str | bytes | None, max_output_bytes: int | None,
                   binary: bool) -> dict[str, Any]:
        body: dict[str, Any] = _drop_none({
            "timeout_ms": _ms(timeout), "env": dict(env) if env else None, "cwd": cwd or None,
            "max_output_bytes": max_output_bytes,
        })
        if isinstance(cmd, str):
            body["command"] = cmd
        else:
            body["argv"] = list(cmd)
        if isinstance(stdin, bytes):
            body["stdin_base64"] = base64.b64encode(stdin).decode()
        elif stdin is not None:
            body["stdin"] = stdin
        if binary:
            body["encoding"] = "base64"
        return body

    async def exec(self, cmd: str | Sequence[str], *, timeout: float | None = None,
                   env: Mapping[str, str] | None = None, cwd: str | None = None,
                   stdin: str | bytes | None = None, max_output_bytes: int | None = None,
                   binary: bool = False) -> ExecResult:
        """Run cmd (a shell command, or argv) and return its result. timeout in
        seconds (the agent's default is 5 min); a command past it has
        ``timed_out`` and exit_code -1. binary: stdout/stderr as exact bytes."""
        body = self._exec_body(cmd, timeout, env, cwd, stdin, max_output_bytes, binary)
        d = await self._json("POST", "exec", json_body=body, timeout=_command_timeout(timeout))
        res = build(ExecResult, d)
        if binary:
            res.stdout = base64.b64decode(res.stdout or "")
            res.stderr = base64.b64decode(res.stderr or "")
        return res

    async def exec_stream(self, cmd: str | Sequence[str], *, timeout: float | None = None,
                          env: Mapping[str, str] | None = None, cwd: str | None = None,
                          stdin: str | bytes | None = None, max_output_bytes: int | None = None,
                          binary: bool = False, unlimited_output: bool = False) -> AsyncIterator[ExecEvent]:
        """Run cmd and yield its output as it comes: ExecEvent ``stdout`` /
        ``stderr`` chunks, then one ``exit`` with the result. A stream that
        breaks raises its error class (Gone when the lease ended)."""
        body = self._exec_body(cmd, timeout, env, cwd, stdin, max_output_bytes, binary)
        if unlimited_output:
            body["unlimited_output"] = True
        try:
            async for ev in self._t.events("POST", sandbox_path(self.id, "exec"), json_body=body):
                if ev.name in ("stdout", "stderr"):
                    data = (ev.json() or {}).get("data", "")
                    yield ExecEvent(ev.name, base64.b64decode(data) if binary else data)
                elif ev.name == "exit":
                    yield ExecEvent("exit", b"" if binary else "", build(ExecResult, ev.json()))
                    return
        except errors.Gone as e:
            await self._explain(e)
            raise
        raise errors.AgentUnreachable("the exec stream ended without its exit event")

    async def kill_all(self) -> KillAllResult:
        """SIGKILL every process of the sandbox but its agent (sessions end)."""
        return build(KillAllResult, await self._json("POST", "kill-all"))

    # -- sessions -------------------------------------------------------------

    def session(self, *, env: Mapping[str, str] | None = None, cwd: str | None = None) -> _Opening[Session]:
        """A new persistent bash session (await it, or ``async with`` it: closed on exit)."""
        async def make() -> Session:
            d = await self._json("POST", "sessions", json_body=_drop_none({"env": dict(env) if env else None, "cwd": cwd}))
            return Session(self, build(SessionInfo, d))
        return _Opening(make())

    async def sessions(self) -> list[SessionInfo]:
        d = await self._json("GET", "sessions")
        return [build(SessionInfo, s) for s in (d or {}).get("sessions") or []]

    # -- processes ------------------------------------------------------------

    async def start_process(self, cmd: str | Sequence[str], *, env: Mapping[str, str] | None = None,
                            cwd: str | None = None, stdin: bool = False, name: str | None = None,
                            rpc: bool = False) -> Process:
        """Start a background process. stdin=True keeps its stdin open for
        :meth:`Process.write_stdin`; name makes it addressable by name (unique
        among running processes: NameInUse); rpc reserves stdout for
        :meth:`Process.call` replies."""
        body: dict[str, Any] = _drop_none({"env": dict(env) if env else None, "cwd": cwd or None,
                                           "name": name, "stdin": stdin or None, "rpc": rpc or None})
        if isinstance(cmd, str):
            body["command"] = cmd
        else:
            body["argv"] = list(cmd)
        return Process(self, build(ProcessInfo, await self._json("POST", "processes", json_body=body)))

    async def processes(self) -> list[ProcessInfo]:
        d = await self._json("GET", "processes")
        return [build(ProcessInfo, p) for p in (d or {}).get("processes") or []]

    def process(self, pid: str) -> Process:
        """A handle on an existing process (by id or name); no call is made."""
        return Process(self, ProcessInfo(id=pid))

    # -- checkpoints ----------------------------------------------------------

    async def checkpoint(self, paths: Sequence[str] | None = None, *, exclude: Sequence[str] | None = None,
                         labels: Mapping[str, str] | None = None) -> Checkpoint:
        """Take a checkpoint of paths (default: the work dir)."""
        body = _drop_none({"paths": list(paths) if paths else None, "exclude": list(exclude) if exclude else None,
                           "labels": dict(labels) if labels else None})
        return build(Checkpoint, await self._json("POST", "checkpoints", json_body=body, timeout=600.0))

    async def restore(self, checkpoint: str | Checkpoint) -> RestoreResult:
        """Restore a checkpoint in place (files made since are removed;
        processes keep running)."""
        ck = checkpoint.id if isinstance(checkpoint, Checkpoint) else checkpoint
        return build(RestoreResult, await self._json("POST", "restore", json_body={"checkpoint": ck}, timeout=600.0))

    async def fork(self, n: int, *, lease_seconds: int | None = None, paths: Sequence[str] | None = None,
                   exclude: Sequence[str] | None = None, labels: Mapping[str, str] | None = None,
                   keep_checkpoint: bool = False) -> ForkResult:
        """Checkpoint now and make n (1..100) new sandboxes of the same pool
        with it restored. Each fork is its own lease; one that could not be
        made is an exception in :attr:`ForkResult.forks` (NoCapacity past the
        pool's room), the others are :class:`Sandbox`."""
        body = _drop_none({"count": n, "lease_seconds": lease_seconds, "paths": list(paths) if paths else None,
                           "exclude": list(exclude) if exclude else None, "labels": dict(labels) if labels else None,
                           "keep_checkpoint": keep_checkpoint or None})
        d = await self._json("POST", "fork", json_body=body, timeout=600.0)
        forks: list[Sandbox | errors.QuarryError] = []
        for f in d.get("forks") or []:
            if f.get("sandbox"):
                forks.append(Sandbox(self._t, build(SandboxInfo, f["sandbox"])))
            else:
                e = f.get("error") or {}
                forks.append(errors.make(str(e.get("code", "")), str(e.get("message", "")), int(e.get("status") or 0)))
        return ForkResult(build(Checkpoint, d.get("checkpoint")), forks)


class ForkResult:
    """What :meth:`Sandbox.fork` made: the checkpoint (deleted unless kept) and
    one entry per fork, a Sandbox or the exception that fork met."""

    def __init__(self, checkpoint: Checkpoint, forks: list[Sandbox | errors.QuarryError]) -> None:
        self.checkpoint = checkpoint
        self.forks = forks

    @property
    def sandboxes(self) -> list[Sandbox]:
        return [f for f in self.forks if isinstance(f, Sandbox)]

    @property
    def errors(self) -> list[errors.QuarryError]:
        return [f for f in self.forks if isinstance(f, errors.QuarryError)]


class _Opening(Generic[_T]):
    """An object being made (a sandbox, a session): await it, or ``async with`` it
    to close it on exit."""

    def __init__(self, coro: Awaitable[_T]) -> None:
        self._coro = coro
        self._obj: Any = None

    def __await__(self) -> Generator[Any, None, _T]:
        return self._coro.__await__()

    async def __aenter__(self) -> _T:
        obj: Any = await self._coro
        self._obj = obj
        entered: _T = await obj.__aenter__()
        return entered

    async def __aexit__(self, *exc: Any) -> None:
        await self._obj.__aexit__(*exc)


class Session:
    """A persistent bash session of a sandbox: cwd, variables and functions
    persist between runs. ``async with`` closes it."""

    def __init__(self, sb: Sandbox, info: SessionInfo) -> None:
        self.sandbox = sb
        self.info = info
        self.id = info.id

    async def run(self, command: str, *, timeout: float | None = None) -> RunResult:
        """Run command in the session. Busy while another run is in progress."""
        body = _drop_none({"command": command, "timeout_ms": _ms(timeout)})
        d = await self.sandbox._json("POST", "sessions", seg(self.id, "session id"), "run", json_body=body,
                                     timeout=_command_timeout(timeout))
        return build(RunResult, d)

    async def close(self) -> None:
        await self.sandbox._json("DELETE", "sessions", seg(self.id, "session id"))

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.close()
        except (errors.NotFound, errors.Gone):
            pass


class Process:
    """A background process of a sandbox."""

    def __init__(self, sb: Sandbox, info: ProcessInfo) -> None:
        self.sandbox = sb
        self.info = info
        self.id = info.id

    def _path(self) -> str:
        return seg(self.id, "process id")

    async def refresh(self) -> ProcessInfo:
        self.info = build(ProcessInfo, await self.sandbox._json("GET", "processes", self._path()))
        return self.info

    async def output(self, offset: int = 0, limit: int | None = None) -> ProcessOutput:
        """The output from offset (stdout and stderr interleaved)."""
        params = _drop_none({"offset": offset, "limit": limit})
        return build(ProcessOutput, await self.sandbox._json("GET", "processes", self._path(), "output", params=params))

    async def follow(self, offset: int = 0) -> AsyncIterator[str]:
        """Yield the output from offset as it comes, until the process exits
        (then :attr:`info` holds its exit)."""
        path = sandbox_path(self.sandbox.id, "processes", self._path(), "output")
        try:
            async for ev in self.sandbox._t.events("GET", path, params={"offset": offset, "follow": "true"}):
                if ev.name == "output":
                    yield (ev.json() or {}).get("data", "")
                elif ev.name == "exit":
                    self.info = build(ProcessInfo, ev.json())
                    return
        except errors.Gone as e:
            await self.sandbox._explain(e)
            raise
        raise errors.AgentUnreachable("the output stream ended without its exit event")

    async def wait(self, timeout: float | None = None) -> ProcessInfo:
        """Wait until the process exits and return its info (exit_code).
        asyncio.TimeoutError after timeout seconds (the process runs on)."""
        async def drain() -> ProcessInfo:
            async for _ in self.follow():
                pass
            return self.info
        return await asyncio.wait_for(drain(), timeout)

    async def signal(self, sig: str = "TERM") -> None:
        await self.sandbox._json("POST", "processes", self._path(), "signal", json_body={"signal": sig})

    async def write_stdin(self, data: bytes | str, *, close: bool = False) -> int:
        """Write data to the process's stdin (started with stdin=True); close
        ends it. Returns the bytes written."""
        raw = data.encode() if isinstance(data, str) else data
        d = await self.sandbox._json("POST", "processes", self._path(), "stdin", content=raw,
                                     params={"close": "true"} if close else None)
        return int((d or {}).get("bytes", 0))

    async def close_stdin(self) -> None:
        await self.write_stdin(b"", close=True)

    async def call(self, request: Any, *, timeout: float | None = None) -> Any:
        """One rpc round trip (a process started with rpc=True): request as one
        JSON line to stdin, the next stdout line back."""
        body = _drop_none({"request": request, "timeout_ms": _ms(timeout)})
        d = await self.sandbox._json("POST", "processes", self._path(), "call", json_body=body,
                                     timeout=_command_timeout(timeout))
        return (d or {}).get("reply")

    async def kill(self) -> None:
        """Kill the process (if running) and forget it."""
        await self.sandbox._json("DELETE", "processes", self._path())


class Files:
    """A sandbox's files. Relative paths are relative to its work directory."""

    def __init__(self, sb: Sandbox) -> None:
        self._sb = sb

    async def _raw(self, method: str, sub: str | None, path: str, params: dict[str, Any] | None = None,
                   content: bytes | None = None) -> Any:
        if not path:
            raise ValueError("path: must not be empty")
        rest = ("files", sub) if sub else ("files",)
        q = {"path": path, **(params or {})}
        try:
            return await self._sb._t.request(method, sandbox_path(self._sb.id, *rest), params=q, content=content,
                                             headers={"Accept": "*/*"}, timeout=600.0)
        except errors.Gone as e:
            await self._sb._explain(e)
            raise

    async def read(self, path: str, *, offset: int = 0, length: int | None = None) -> bytes:
        params = _drop_none({"offset": offset or None, "length": length})
        return (await self._raw("GET", None, path, params)).content  # type: ignore[no-any-return]

    async def read_text(self, path: str, *, encoding: str = "utf-8") -> str:
        return (await self.read(path)).decode(encoding)

    async def write(self, path: str, data: bytes | str, *, mode: int | None = None,
                    exclusive: bool = False) -> WriteResult:
        """Write a file whole (parents made). exclusive: Conflict when it exists."""
        raw = data.encode() if isinstance(data, str) else data
        params = _drop_none({"mode": None if mode is None else format(mode, "04o"),
                             "exclusive": "true" if exclusive else None})
        return build(WriteResult, (await self._raw("PUT", None, path, params, raw)).json())

    async def write_text(self, path: str, text: str, *, encoding: str = "utf-8", mode: int | None = None) -> WriteResult:
        return await self.write(path, text.encode(encoding), mode=mode)

    async def delete(self, path: str) -> None:
        await self._raw("DELETE", None, path)

    async def stat(self, path: str) -> FileInfo:
        return build(FileInfo, (await self._raw("GET", "stat", path)).json())

    async def list(self, path: str = ".") -> list[FileInfo]:
        d = (await self._raw("GET", "list", path)).json()
        return [build(FileInfo, e) for e in (d or {}).get("entries") or []]

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
        except errors.NotFound:
            return False
        return True

    async def upload_archive(self, path: str, tar: bytes) -> WriteResult:
        """Extract a tar (or tar.gz) into the directory path."""
        return build(WriteResult, (await self._raw("PUT", "archive", path, None, tar)).json())

    async def download_archive(self, path: str, *, gzip: bool = False) -> bytes:
        """The directory path as a tar (tar.gz with gzip)."""
        return (await self._raw("GET", "archive", path, {"gzip": "true"} if gzip else None)).content  # type: ignore[no-any-return]

    async def upload_dir(self, local_dir: str | os.PathLike[str], path: str) -> WriteResult:
        """Upload the local directory's contents into path (as one tar)."""
        src = Path(local_dir)
        if not src.is_dir():
            raise NotADirectoryError(str(src))
        buf = await asyncio.to_thread(_tar_dir, src)
        return await self.upload_archive(path, buf)

    async def download_dir(self, path: str, local_dir: str | os.PathLike[str]) -> List[str]:  # noqa: UP006
        """Download the directory path into local_dir (made if missing); returns
        the names extracted. Entries that would land outside local_dir, and
        device files, are refused (ValueError)."""
        data = await self.download_archive(path)
        return await asyncio.to_thread(_untar, data, Path(local_dir))


def _tar_dir(src: Path) -> bytes:
    with tempfile.SpooledTemporaryFile(max_size=64 << 20) as f:
        with tarfile.open(fileobj=f, mode="w") as tf:
            for entry in sorted(src.iterdir()):
                tf.add(str(entry), arcname=entry.name)
        f.seek(0)
        return f.read()


def _untar(data: bytes, dest: Path) -> list[str]:
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    names: list[str] = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
        members = tf.getmembers()
        for m in members:
            target = (root / m.name).resolve()
            if target != root and root not in target.parents:
                raise ValueError(f"archive entry {m.name!r}: outside {root}")
            if m.isdev():
                raise ValueError(f"archive entry {m.name!r}: a device file")
            if (m.issym() or m.islnk()) and os.path.isabs(m.linkname):
                raise ValueError(f"archive entry {m.name!r}: an absolute link")
            names.append(m.name)
        tf.extractall(root, members=members)
    return [n for n in names if n not in (".", "./")]


class SandboxModel:
    """The model relay as seen from one sandbox: its transcript."""

    def __init__(self, sb: Sandbox) -> None:
        self._sb = sb

    async def transcript(self, *, after: str | None = None, limit: int | None = None) -> list[Exchange]:
        """The lease's request/response pairs, oldest first (every page)."""
        out: list[Exchange] = []
        cursor = after
        while True:
            d = await self._sb._json("GET", "model", "transcript", params=_drop_none({"after": cursor, "limit": limit}))
            out.extend(build(Exchange, x) for x in (d or {}).get("exchanges") or [])
            cursor = (d or {}).get("next_after")
            if not cursor:
                return out


class Sandboxes:
    """``q.sandboxes``: create, list and get leases."""

    def __init__(self, t: Transport) -> None:
        self._t = t

    def create(self, pool: str | None = None, *, image: str | None = None, class_: str | None = None,
               cpu: float | None = None, memory: int | str | None = None, disk: int | str | None = None,
               env: Mapping[str, str] | None = None,
               labels: Mapping[str, str] | None = None, lease_seconds: int | None = None,
               from_checkpoint: str | Checkpoint | None = None, keep_alive: bool = False,
               idempotency_key: str | None = None, retry_timeout: float = 60.0) -> _Opening[Sandbox]:
        """Lease a sandbox (await it, or ``async with`` it: released on exit).

        A sandbox is of a pool (None: the gateway's default), or of an image
        the operator allows: the gateway makes (or finds) its on-demand pool,
        of the class named (class_; None: the first class that serves it),
        with cpu, memory and disk (None: the class's; memory and disk an int
        of MiB or a string such as "2Gi"), within the class's bounds
        (:meth:`AsyncQuarry.classes`). An image is refused with
        ImageNotAllowed, ImageNotFound, ImageDenied or RegistryUnavailable;
        a class on a provider that runs no images with BadRequest.

        A 503 (Unavailable, NoCapacity, RegistryUnavailable: nothing was made)
        is retried after the server's Retry-After, with one Idempotency-Key
        for every attempt, for up to retry_timeout seconds (0: never); then it
        is raised. Nothing else is retried. keep_alive starts
        :meth:`Sandbox.keep_alive`."""
        first = {"pool": pool, **image_fields(image, class_, cpu, memory, disk)}
        body = lease_request(first, lease_seconds, env, labels, from_checkpoint)

        async def make() -> Sandbox:
            d = await create_with_retry(self._t, "/v1/sandboxes", body, idempotency_key, retry_timeout)
            sb = Sandbox(self._t, build(SandboxInfo, d))
            if keep_alive:
                sb.keep_alive()
            return sb
        return _Opening(make())

    async def get(self, sandbox_id: str) -> Sandbox:
        return Sandbox(self._t, build(SandboxInfo, await self._t.json("GET", sandbox_path(sandbox_id))))

    def attach(self, sandbox_id: str) -> Sandbox:
        """A handle on a sandbox by id, without a call."""
        return Sandbox(self._t, SandboxInfo(id=sandbox_id))

    async def list(self, *, pool: str | None = None, state: str | None = None,
                   labels: Mapping[str, str] | None = None, limit: int | None = None) -> list[SandboxInfo]:
        """The caller's sandboxes, newest first (every label must match)."""
        params: list[tuple[str, Any]] = list(_drop_none({"pool": pool, "state": state, "limit": limit}).items())
        params += label_params(labels)
        d = await self._t.json("GET", "/v1/sandboxes", params=params)
        return [build(SandboxInfo, s) for s in (d or {}).get("sandboxes") or []]


def lease_request(first: dict[str, Any], lease_seconds: int | None, env: Mapping[str, str] | None,
                  labels: Mapping[str, str] | None, from_checkpoint: str | Checkpoint | None) -> dict[str, Any]:
    """The body of a create (a sandbox's or an env's): first, then the lease's fields."""
    ck = from_checkpoint.id if isinstance(from_checkpoint, Checkpoint) else from_checkpoint
    return _drop_none({**first, "lease_seconds": lease_seconds, "env": dict(env) if env else None,
                       "labels": dict(labels) if labels else None, "from_checkpoint": ck})


async def create_with_retry(t: Transport, path: str, body: dict[str, Any], key: str | None,
                            retry_timeout: float) -> Any:
    """POST a create, retrying 503s after their Retry-After with one
    Idempotency-Key (key, or a new one) until retry_timeout; nothing else is
    retried."""
    key = key or f"py-{uuid.uuid4()}"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + retry_timeout
    while True:
        try:
            return await t.json("POST", path, json_body=body, headers={"Idempotency-Key": key}, timeout=CREATE_TIMEOUT)
        except errors.Unavailable as e:
            if e.status != 503:
                raise
            wait = e.retry_after if e.retry_after is not None else 1.0
            if loop.time() + wait > deadline:
                raise
            log.info("quarry: create answered %s; retrying in %.0fs with the same Idempotency-Key", e.code, wait)
            await asyncio.sleep(wait)


__all__ = ["Sandbox", "Sandboxes", "Session", "Process", "Files", "SandboxModel", "ForkResult", "parse_time"]
