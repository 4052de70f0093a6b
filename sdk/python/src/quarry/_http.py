"""The one place requests are made: the connection pool, auth, timeouts, errors
and server-sent events. Every call of the SDK (async and sync) goes through
:class:`Transport`."""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from . import errors

#: Connections one client keeps open at most: a trainer drives thousands of
#: sandboxes from one process, each with a call in flight.
DEFAULT_MAX_CONNECTIONS = 4096
#: Idle connections kept for reuse.
DEFAULT_MAX_KEEPALIVE = 1024
#: The pool is split into this many httpx pools (the limits shared out):
#: httpcore's pool does work proportional to the requests and connections it
#: holds on every request and every answer, which at a thousand in flight in
#: one httpx pool costs more CPU than the calls themselves. A sandbox's calls
#: always go to the same shard (its connections are reused).
DEFAULT_POOL_SHARDS = 16
#: Timeout of ordinary calls (the gateway's QUARRY_REQUEST_TIMEOUT is 30 s).
DEFAULT_TIMEOUT = 60.0
#: Added to a command's own timeout for its answer (the gateway adds 10 s).
COMMAND_MARGIN = 30.0
#: Reads of an event stream: the gateway sends keep-alives every 15 s.
STREAM_READ_TIMEOUT = 120.0
#: A create's answer: the gateway's QUARRY_CREATE_TIMEOUT (5 min) bounds a
#: cold start, an image's pull included, and answers a retryable 503 past it.
CREATE_TIMEOUT = 330.0
#: Reads of a build's log: the gateway sends an empty event ({}) after 15 s
#: of silence, so a read that waits a minute means the connection is dead.
BUILD_READ_TIMEOUT = 60.0


def seg(value: str, what: str) -> str:
    """One path segment, escaped; an empty one is refused before any request."""
    if not value:
        raise ValueError(f"{what}: must not be empty")
    return quote(value, safe="")


def sandbox_path(sandbox_id: str, *rest: str) -> str:
    p = "/v1/sandboxes/" + seg(sandbox_id, "sandbox id")
    for r in rest:
        p += "/" + r
    return p


def label_params(labels: Mapping[str, str] | None) -> list[tuple[str, str]]:
    return [("label", f"{k}={v}") for k, v in sorted((labels or {}).items())]


@dataclass
class Event:
    """One server-sent event: its name and its data (JSON)."""

    name: str
    data: str

    def json(self) -> Any:
        return json.loads(self.data) if self.data else None


async def iter_events(response: httpx.Response) -> AsyncIterator[Event]:
    """The events of a text/event-stream answer (comments skipped)."""
    name, data = "", list[str]()
    async for line in response.aiter_lines():
        if line == "":
            if data or name:
                yield Event(name or "message", "\n".join(data))
            name, data = "", list[str]()
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
    if data or name:
        yield Event(name or "message", "\n".join(data))


class Transport:
    """The HTTP side of a client: one httpx.AsyncClient (one connection pool)
    for every call, with the API key, JSON bodies and the error classes."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_keepalive_connections: int = DEFAULT_MAX_KEEPALIVE,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
        pool_shards: int = DEFAULT_POOL_SHARDS,
    ) -> None:
        base_url = base_url or os.environ.get("QUARRY_URL") or "http://127.0.0.1:8080"
        api_key = api_key if api_key is not None else os.environ.get("QUARRY_API_KEY", "")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        h = {"Authorization": f"Bearer {api_key}", "User-Agent": "quarry-sandbox-python"}
        h.update(headers or {})
        # A transport of the caller's (a mock, a recorder) is one: no shards.
        shards = 1 if transport is not None else max(1, min(pool_shards, max_connections))
        self.max_connections = max_connections
        self.shards = [
            httpx.AsyncClient(
                base_url=self.base_url,
                headers=h,
                timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
                limits=httpx.Limits(
                    max_connections=max(1, max_connections // shards),
                    max_keepalive_connections=max(1, max_keepalive_connections // shards),
                    keepalive_expiry=30.0,
                ),
                transport=transport,
            )
            for _ in range(shards)
        ]
        self.http = self.shards[0]
        self._next = 0

    def _shard(self, path: str) -> httpx.AsyncClient:
        """A sandbox's calls go to one shard (by its id); other calls take turns."""
        if len(self.shards) == 1:
            return self.http
        if path.startswith("/v1/sandboxes/"):
            sid = path[len("/v1/sandboxes/"):].split("/", 1)[0]
            return self.shards[zlib.crc32(sid.encode()) % len(self.shards)]
        self._next = (self._next + 1) % len(self.shards)
        return self.shards[self._next]

    async def aclose(self) -> None:
        for c in self.shards:
            await c.aclose()

    def _timeout(self, seconds: float | None) -> httpx.Timeout:
        t = self.timeout if seconds is None else max(seconds, self.timeout)
        return httpx.Timeout(t, connect=min(t, 10.0))

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        content: bytes | None = None,
        params: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        """One call; its answer read whole. A non-2xx answer raises its
        :mod:`quarry.errors` class. Nothing is retried."""
        h = dict(headers or {})
        if json_body is not None:
            content = json.dumps(json_body).encode()
            h["Content-Type"] = "application/json"
        elif content is not None:
            h.setdefault("Content-Type", "application/octet-stream")
        h.setdefault("Accept", "application/json")
        resp = await self._shard(path).request(method, path, content=content, params=params, headers=h,
                                       timeout=self._timeout(timeout))
        if resp.status_code >= 300:
            raise errors.from_response(resp)
        return resp

    async def json(self, method: str, path: str, **kw: Any) -> Any:
        resp = await self.request(method, path, **kw)
        if not resp.content:
            return None
        return resp.json()

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        content: Any = None,
        params: Any = None,
        accept: str = "text/event-stream",
        headers: Mapping[str, str] | None = None,
        read_timeout: float = STREAM_READ_TIMEOUT,
    ) -> AsyncIterator[httpx.Response]:
        """A call whose answer is read as it arrives (events, archives, a
        build's log), read_timeout the longest wait for its next bytes. A
        non-2xx answer raises before the body is handed out."""
        h = dict(headers or {})
        h["Accept"] = accept
        if json_body is not None:
            content = json.dumps(json_body).encode()
            h["Content-Type"] = "application/json"
        elif content is not None:
            h.setdefault("Content-Type", "application/octet-stream")
        t = httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0), read=read_timeout)
        async with self._shard(path).stream(method, path, content=content, params=params, headers=h,
                                    timeout=t) as resp:
            if resp.status_code >= 300:
                await resp.aread()
                raise errors.from_response(resp)
            yield resp

    async def events(self, method: str, path: str, **kw: Any) -> AsyncIterator[Event]:
        """The events of a streamed call; an ``error`` event raises its class."""
        async with self.stream(method, path, **kw) as resp:
            async for ev in iter_events(resp):
                if ev.name == "error":
                    d = ev.json() or {}
                    raise errors.make(str(d.get("code", "")), str(d.get("message", "")))
                yield ev
