"""Quarry: the sync client, a thin wrapper over the async one.

There is one implementation of every call (the async objects). The sync
client runs them on an event loop in a thread of its own and hands back the
same objects behind :class:`SyncProxy`: a coroutine's result is returned, an
async iterator becomes an iterator, an async context manager a context
manager. Methods, arguments, results and errors are those of the async API.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ._client import AsyncQuarry


class _Portal:
    """An event loop in a daemon thread; call() runs work on it and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="quarry-sync", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        async def invoke() -> Any:
            r = fn(*args, **kwargs)
            if inspect.isawaitable(r):
                r = await r
            return r
        fut = asyncio.run_coroutine_threadsafe(invoke(), self.loop)
        try:
            return fut.result()
        except BaseException:
            if not fut.done():
                fut.cancel()
                try:
                    fut.result(timeout=5)
                except (concurrent.futures.CancelledError, Exception):
                    pass
            raise

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


_WRAPPED = {
    "Sandbox", "Sandboxes", "Session", "Process", "Files", "SandboxModel", "ForkResult",
    "Checkpoints", "Model", "ModelCall", "Envs", "Env", "Images", "AsyncQuarry",
}


def _wrap(value: Any, portal: _Portal) -> Any:
    if type(value).__name__ in _WRAPPED and type(value).__module__.startswith("quarry."):
        return SyncProxy(value, portal)
    if isinstance(value, list):
        return [_wrap(v, portal) for v in value]
    if isinstance(value, tuple):
        return tuple(_wrap(v, portal) for v in value)
    if hasattr(value, "__anext__"):
        return _SyncIterator(value, portal)
    return value


class _SyncIterator(Iterator[Any]):
    def __init__(self, agen: Any, portal: _Portal) -> None:
        self._agen = agen
        self._portal = portal

    def __next__(self) -> Any:
        try:
            return _wrap(self._portal.call(self._agen.__anext__), self._portal)
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        if hasattr(self._agen, "aclose"):
            self._portal.call(self._agen.aclose)


class SyncProxy:
    """The sync face of one async object of this SDK."""

    __slots__ = ("_obj", "_portal")

    def __init__(self, obj: Any, portal: _Portal) -> None:
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_portal", portal)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._obj, name)
        if callable(attr) and not isinstance(attr, type):
            portal = self._portal

            def call(*args: Any, **kwargs: Any) -> Any:
                return _wrap(portal.call(attr, *args, **kwargs), portal)
            call.__name__ = name
            call.__doc__ = attr.__doc__
            return call
        return _wrap(attr, self._portal)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._obj, name, value)

    def __repr__(self) -> str:
        return repr(self._obj)

    def __dir__(self) -> list[str]:
        return dir(self._obj)

    def __eq__(self, other: object) -> bool:
        return bool(self._obj == (other._obj if isinstance(other, SyncProxy) else other))

    def __hash__(self) -> int:
        return hash(self._obj)

    def __enter__(self) -> Any:
        r = self._portal.call(self._obj.__aenter__)
        return _wrap(r, self._portal)

    def __exit__(self, *exc: Any) -> None:
        self._portal.call(self._obj.__aexit__, *exc)


class Quarry(SyncProxy):
    """The sync client: the same namespaces and methods as :class:`AsyncQuarry`,
    returning results instead of coroutines (``with q.sandboxes.create() as sb:
    sb.exec("ls")``). Calls may come from several threads at once. Use ``with``
    or :meth:`close`."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, **kwargs: Any) -> None:
        portal = _Portal()
        client = portal.call(AsyncQuarry, base_url, api_key, **kwargs)
        super().__init__(client, portal)

    def close(self) -> None:
        try:
            self._portal.call(self._obj.aclose)
        finally:
            self._portal.close()

    def __enter__(self) -> Quarry:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
