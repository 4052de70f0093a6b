"""Images on demand: prefetch, the images of on-demand pools, waiting for
them, and builds (async; the sync client wraps these same objects). A
sandbox of an image is ``sandboxes.create(image=...)``."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import IO, Any, List, Union

from . import errors
from ._http import BUILD_READ_TIMEOUT, Transport
from ._sandbox import _drop_none, _tar_dir, image_fields
from .types import BuildResult, Image, ImagePage, PrefetchedImage, build

#: The page size list() asks for (the gateway's most).
PAGE_LIMIT = 1000
#: list() walks at most this many pages (a million images).
MAX_PAGES = 1000
#: Chunks of a build context read from a file.
CHUNK = 1 << 20

#: What wait() waits for: an image reference (prefetched first) or a
#: prefetch's answer.
Awaited = Union[str, PrefetchedImage]
#: A build context: a directory (sent as a tar), a tar file's path, a tar's
#: bytes, or a binary file of a tar.
BuildContext = Union[str, "os.PathLike[str]", bytes, IO[bytes]]


def _prefetched(d: Any) -> PrefetchedImage:
    p = build(PrefetchedImage, d)
    e = d.get("error") if isinstance(d, dict) else None
    if isinstance(e, dict):
        p.error = errors.make(str(e.get("code") or ""), str(e.get("message") or ""), int(e.get("status") or 0))
    else:
        p.error = None
    return p


class Images:
    """``q.images``: images on demand (docs/API.md, "Images on demand")."""

    def __init__(self, t: Transport) -> None:
        self._t = t

    async def prefetch(self, images: str | Sequence[str], *, warm: int = 0, class_: str | None = None,
                       cpu: float | None = None, memory: int | str | None = None,
                       disk: int | str | None = None) -> list[PrefetchedImage]:
        """Start preparing images the next creates will ask for (a pull; on
        ECS, a task definition) and answer at once, one result per image in
        order: its pool and state (``queued`` or ``ready``), or ``refused``
        with the error a create of it would raise (it does not fail the
        call). class_, cpu, memory and disk are those of the creates to come
        (their pool is one of these values); warm keeps that many sandboxes
        of each ready until the class's warm window has passed. Raises
        BadRequest for no images, too many (1,000) or a bad warm."""
        names = [images] if isinstance(images, str) else list(images)
        body = {"images": names, **image_fields(None, class_, cpu, memory, disk)}
        if warm:
            body["warm"] = warm
        d = await self._t.json("POST", "/v1/images/prefetch", json_body=body)
        return [_prefetched(x) for x in (d or {}).get("images") or []]

    async def list_page(self, cursor: str | None = None, *, limit: int | None = None) -> ImagePage:
        """One page of the on-demand pools' images after cursor (None: the
        first), at most limit (the gateway's default 100, at most 1,000); its
        ``next`` is the cursor of the next page, None after the last. The
        first page also lists the images providers are preparing or failed
        to prepare that no pool holds yet."""
        d = await self._t.json("GET", "/v1/images", params=_drop_none({"cursor": cursor or None, "limit": limit}))
        d = d or {}
        return ImagePage(images=[build(Image, x) for x in d.get("images") or []], next=d.get("next") or None)

    async def list(self) -> List[Image]:  # noqa: UP006 (list is this method inside the class)
        """Every image of the on-demand pools (every page)."""
        out: list[Image] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            page = await self.list_page(cursor, limit=PAGE_LIMIT)
            out.extend(page.images)
            if page.next is None:
                return out
            cursor = page.next
        raise RuntimeError(f"list images: more than {MAX_PAGES} pages")

    async def wait(self, images: Awaited | Sequence[Awaited], *, timeout: float = 900.0, interval: float = 1.0,
                   on_progress: Callable[[List[Image]], Any] | None = None) -> List[Image]:  # noqa: UP006
        """Wait until each image is ready: its on-demand pool active and the
        provider holding its image. images are prefetch's answers, or image
        references, which are prefetched first (with their class's defaults:
        prefetch yourself for another class or size). Polls GET /v1/images
        every interval seconds, calling on_progress (a function or a
        coroutine function) after each poll with one Image per image in
        order (state ``queued`` for one not listed yet); returns them once
        all are ready.

        Raises the error of a refused prefetch at once, ImageFailed (with the
        provider's reason) when an image's preparation failed, and
        TimeoutError naming those not ready after timeout seconds."""
        given: list[Awaited] = [images] if isinstance(images, (str, PrefetchedImage)) else list(images)
        names = [x for x in given if isinstance(x, str)]
        fetched = iter(await self.prefetch(names) if names else [])
        wanted = [x if isinstance(x, PrefetchedImage) else next(fetched) for x in given]
        for w in wanted:
            if w.error is not None:
                raise w.error
        if not wanted:
            return []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        params: List[tuple[str, Any]] = [("pool", w.pool) for w in wanted if w.pool]
        params += [("image", w.ref) for w in wanted if w.ref]
        while True:
            listed = await self._listed(params)
            now = [_status(w, listed) for w in wanted]
            if on_progress is not None:
                r = on_progress(now)
                if inspect.isawaitable(r):
                    await r
            for w, st in zip(wanted, now):
                if st.failed:
                    raise errors.ImageFailed(f"image {w.ref or w.image}: its preparation failed: {st.reason}",
                                             image=w.ref or w.image, reason=st.reason)
            if all(st.ready for st in now):
                return now
            left = deadline - loop.time()
            if left <= 0:
                waiting = ", ".join(f"{st.image} ({st.state})" for st in now if not st.ready)
                raise TimeoutError(f"images not ready after {timeout:g}s: {waiting}")
            await asyncio.sleep(min(interval, left))

    async def _listed(self, params: List[tuple[str, Any]]) -> List[Image]:
        """The images of the pools and references in params (GET
        /v1/images?pool=&image=, at most 100 of each a call)."""
        out: List[Image] = []
        pools = [p for p in params if p[0] == "pool"]
        refs = [p for p in params if p[0] == "image"]
        for i in range(0, max(len(pools), len(refs), 1), 100):
            d = await self._t.json("GET", "/v1/images", params=pools[i:i + 100] + refs[i:i + 100])
            out += [build(Image, x) for x in (d or {}).get("images") or []]
        return out

    async def build(self, name: str, context: BuildContext, *, dockerfile: str | None = None,
                    class_: str | None = None,
                    on_log: Callable[[str], Any] | None = None) -> BuildResult:
        """Build an image on the gateway's engine from context (a directory,
        sent as a tar; a tar file's path; a tar's bytes; or a binary file of a
        tar) with its Dockerfile (dockerfile: a path inside the context,
        default "Dockerfile"), on a class's provider (class_; None: the first
        that builds). on_log (a function or a coroutine function) gets each
        line of the build's log as it comes. Returns the image built, which
        a create may name at once (its name is the gateway's, under
        ``quarry-build/``).

        Builds are off unless the operator names the key (Forbidden, with
        the key's owner id); a build that ran and failed raises BuildFailed
        with the build's message."""
        params = _drop_none({"name": name, "dockerfile": dockerfile, "class": class_})
        body = await _context_body(context)
        async with self._t.stream("POST", "/v1/images/build", params=params, content=body,
                                  accept="application/x-ndjson", headers={"Content-Type": "application/x-tar"},
                                  read_timeout=BUILD_READ_TIMEOUT) as resp:
            async for line in resp.aiter_lines():
                if not line.strip():
                    continue
                ev = json.loads(line)
                err = ev.get("error")
                if isinstance(err, dict):
                    raise errors.make(str(err.get("code") or ""), str(err.get("message") or ""),
                                      int(err.get("status") or 0))
                if ev.get("image"):
                    return build(BuildResult, ev)
                if on_log is not None and "log" in ev:  # {} is a keep-alive
                    r = on_log(str(ev["log"]))
                    if inspect.isawaitable(r):
                        await r
        raise errors.AgentUnreachable("the build's answer ended without its result")


def _status(w: PrefetchedImage, listed: list[Image]) -> Image:
    """What GET /v1/images says of a prefetched image: its pool's entry, else
    the provider's entry of its reference while no pool holds it (its first
    preparation), else queued."""
    loose: Image | None = None
    for im in listed:
        if im.pool and im.pool == w.pool:
            return im
        if not im.pool and im.image == w.ref:
            loose = im
    return loose or Image(image=w.ref or w.image, pool=w.pool, state="queued")


async def _context_body(context: BuildContext) -> bytes | AsyncIterator[bytes]:
    """A build context as a request body: a directory as a tar, a tar's
    bytes as they are, a tar file (a path or a binary file) read in chunks."""
    if isinstance(context, bytes):
        return context
    if isinstance(context, (str, os.PathLike)):
        path = Path(context)
        if path.is_dir():
            return await asyncio.to_thread(_tar_dir, path)
        if not path.is_file():
            raise FileNotFoundError(f"build context {path}: neither a directory nor a tar file")
        return _chunks(await asyncio.to_thread(open, path, "rb"), close=True)
    if hasattr(context, "read"):
        return _chunks(context, close=False)
    raise TypeError(f"build context: want a directory, a tar file or its bytes, got {type(context).__name__}")


async def _chunks(f: IO[bytes], *, close: bool) -> AsyncIterator[bytes]:
    try:
        while True:
            b = await asyncio.to_thread(f.read, CHUNK)
            if not b:
                return
            yield b
    finally:
        if close:
            f.close()


__all__ = ["Images", "Awaited", "BuildContext"]
