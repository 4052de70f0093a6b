"""The model relay's trainer side (docs/MODELSERVICE.md): claim the calls that
programs in sandboxes make through an OpenAI client, and answer them."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, Union

from . import errors
from ._http import Transport, label_params, seg
from .types import parse_time

log = logging.getLogger("quarry")

#: Longest long-poll the gateway allows (QUARRY_RELAY_MAX_WAIT).
MAX_WAIT_MS = 30000

Chunks = Union[Iterable[Any], AsyncIterable[Any]]
#: What a serve handler returns: a completion (dict), chunks to stream, or an
#: awaitable of either.
HandlerResult = Union[Mapping[str, Any], Chunks, None]
Handler = Callable[["ModelCall"], Union[HandlerResult, Awaitable[HandlerResult]]]


class ModelCall:
    """One claimed call of a program in a sandbox. ``request`` is its OpenAI
    body (verbatim), ``stream`` whether it asked for server-sent events.
    Answer it once: :meth:`respond`, :meth:`respond_stream` or :meth:`respond_error`."""

    def __init__(self, t: Transport, d: Mapping[str, Any]) -> None:
        self._t = t
        self.raw = dict(d)
        self.id: str = str(d.get("id", ""))
        self.sandbox_id: str = str(d.get("sandbox_id", ""))
        self.pool: str = str(d.get("pool", ""))
        self.labels: dict[str, str] = dict(d.get("labels") or {})
        self.route: str = str(d.get("route", ""))
        self.stream: bool = bool(d.get("stream", False))
        self.attempt: int = int(d.get("attempt") or 0)
        self.received_at = parse_time(d.get("received_at"))
        self.deadline = parse_time(d.get("deadline"))
        self.request: Any = d.get("body")
        self.answered = False

    def __repr__(self) -> str:
        return f"ModelCall({self.id!r}, sandbox={self.sandbox_id!r}, route={self.route!r}, stream={self.stream})"

    @property
    def messages(self) -> list[Any]:
        """The chat messages of the request ([] for a completions call)."""
        body = self.request if isinstance(self.request, dict) else {}
        return list(body.get("messages") or [])

    def _path(self) -> str:
        return "/v1/model/requests/" + seg(self.id, "request id") + "/response"

    async def respond(self, completion: Mapping[str, Any], *, status: int | None = None) -> None:
        """Answer with an OpenAI completion (a dict with ``choices``). For a
        streaming call the gateway sends it as chunks. Conflict when answered
        already, Gone when the agent gave up."""
        await self._t.request("POST", self._path(), json_body=dict(completion),
                              params={"status": status} if status else None)
        self.answered = True

    async def respond_error(self, status: int, message: str, *, type: str = "server_error") -> None:
        """Answer with an HTTP error (400..599) and an OpenAI error object."""
        body = {"error": {"message": message, "type": type, "code": None}}
        await self._t.request("POST", self._path(), json_body=body, params={"status": status})
        self.answered = True

    async def respond_stream(self, chunks: Chunks) -> None:
        """Answer with chunks of your own (``chat.completion.chunk`` dicts, or
        strings of JSON), sent as server-sent events ending with ``[DONE]``."""
        parts: list[bytes] = []

        def add(c: Any) -> None:
            data = c if isinstance(c, str) else json.dumps(c)
            if data.strip() != "[DONE]":
                parts.append(b"data: " + data.encode() + b"\n\n")

        if isinstance(chunks, AsyncIterable):
            async for c in chunks:
                add(c)
        else:
            for c in chunks:
                add(c)
        parts.append(b"data: [DONE]\n\n")
        await self._t.request("POST", self._path(), content=b"".join(parts),
                              headers={"Content-Type": "text/event-stream"})
        self.answered = True


class Model:
    """``q.model``: the relay's trainer loop."""

    def __init__(self, t: Transport) -> None:
        self._t = t

    async def claim(self, *, max: int = 1, wait: float = 30.0, pool: str | None = None,
                    labels: Mapping[str, str] | None = None) -> list[ModelCall]:
        """One long-poll: up to max pending calls, waiting up to wait seconds (≤ 30)."""
        wait_ms = min(MAX_WAIT_MS, max_(0, int(wait * 1000)))
        params: list[tuple[str, Any]] = [("wait_ms", wait_ms), ("max", max)]
        if pool:
            params.append(("pool", pool))
        params += label_params(labels)
        d = await self._t.json("GET", "/v1/model/requests", params=params, timeout=wait_ms / 1000 + 30)
        return [ModelCall(self._t, r) for r in (d or {}).get("requests") or []]

    async def calls(self, *, max: int = 16, wait: float = 30.0, pool: str | None = None,
                    labels: Mapping[str, str] | None = None, limit: int | None = None) -> AsyncIterator[ModelCall]:
        """Yield pending calls as they arrive, claiming up to max per poll,
        forever (or until limit calls were yielded)."""
        n = 0
        while limit is None or n < limit:
            want = max if limit is None else min(max, limit - n)
            for c in await self.claim(max=want, wait=wait, pool=pool, labels=labels):
                n += 1
                yield c

    async def serve(self, handler: Handler, *, concurrency: int = 64, pool: str | None = None,
                    labels: Mapping[str, str] | None = None, max_calls: int | None = None,
                    wait: float = 30.0) -> int:
        """Answer calls with handler until cancelled (or max_calls were
        answered); returns how many were handled.

        handler(call) returns (or awaits to) a completion dict, which is sent
        with :meth:`ModelCall.respond`, or an iterable / async iterable of chunks,
        sent with :meth:`ModelCall.respond_stream`; or it answers the call itself
        (None). A plain function runs in a worker thread. At most concurrency
        handlers run at once. A handler that raises answers its call with a 500
        (logged); an answer the gateway refuses (the agent gave up: Gone) is
        logged and the loop goes on."""
        sem = asyncio.Semaphore(concurrency)
        tasks: set[asyncio.Task[None]] = set()
        handled = 0
        claimed = 0
        is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(getattr(handler, "__call__", None))

        async def run(call: ModelCall) -> None:
            nonlocal handled
            try:
                out = await handler(call) if is_async else await asyncio.to_thread(handler, call)  # type: ignore[misc]
                if inspect.isawaitable(out):
                    out = await out
                if call.answered or out is None:
                    pass
                elif isinstance(out, Mapping):
                    await call.respond(out)
                else:
                    await call.respond_stream(out)
            except asyncio.CancelledError:
                raise
            except errors.QuarryError as e:
                log.warning("quarry: answer to %s refused: %s", call.id, e)
            except Exception as e:
                log.exception("quarry: handler failed on %s", call.id)
                if not call.answered:
                    try:
                        await call.respond_error(500, f"trainer handler failed: {type(e).__name__}: {e}")
                    except errors.QuarryError:
                        pass
            finally:
                handled += 1
                sem.release()

        try:
            while max_calls is None or claimed < max_calls:
                await sem.acquire()
                free = 1
                while not sem.locked() and free < 1000:  # take every free slot for one claim
                    await sem.acquire()
                    free += 1
                if max_calls is not None:
                    extra = free - (max_calls - claimed)
                    for _ in range(max_(0, extra)):
                        sem.release()
                    free = min(free, max_calls - claimed)
                try:
                    got = await self.claim(max=free, wait=wait, pool=pool, labels=labels)
                except BaseException:
                    for _ in range(free):
                        sem.release()
                    raise
                for _ in range(free - len(got)):
                    sem.release()
                for c in got:
                    claimed += 1
                    task = asyncio.create_task(run(c))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for task in list(tasks):
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        return handled


def max_(a: int, b: int) -> int:
    return a if a > b else b
