"""AsyncQuarry: the client."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from ._envs import Envs
from ._images import Images
from ._http import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_KEEPALIVE, DEFAULT_POOL_SHARDS, DEFAULT_TIMEOUT, Transport, label_params, seg
from ._model import Model
from ._sandbox import Sandboxes, _drop_none
from .types import Checkpoint, Class, Pool, build


class Checkpoints:
    """``q.checkpoints``: the caller's stored checkpoints."""

    def __init__(self, t: Transport) -> None:
        self._t = t

    async def list(self, *, labels: Mapping[str, str] | None = None, limit: int | None = None) -> list[Checkpoint]:
        params: list[tuple[str, Any]] = list(label_params(labels))
        if limit:
            params.append(("limit", limit))
        d = await self._t.json("GET", "/v1/checkpoints", params=params)
        return [build(Checkpoint, c) for c in (d or {}).get("checkpoints") or []]

    async def get(self, checkpoint_id: str) -> Checkpoint:
        return build(Checkpoint, await self._t.json("GET", "/v1/checkpoints/" + seg(checkpoint_id, "checkpoint id")))

    async def delete(self, checkpoint: str | Checkpoint) -> None:
        """Delete a checkpoint (again: nothing)."""
        cid = checkpoint.id if isinstance(checkpoint, Checkpoint) else checkpoint
        await self._t.request("DELETE", "/v1/checkpoints/" + seg(cid, "checkpoint id"))


class AsyncQuarry:
    """The async client. ``base_url`` and ``api_key`` default to $QUARRY_URL and
    $QUARRY_API_KEY. One client holds one connection pool (up to
    max_connections, default 4096, split into pool_shards httpx pools: a
    sandbox's calls stay on one) for every call: share it between tasks.
    Use ``async with`` or :meth:`aclose`.

    Namespaces: :attr:`sandboxes`, :attr:`checkpoints`, :attr:`model` (the
    relay's trainer loop), :attr:`envs`, :attr:`images` (images on demand)."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *,
                 timeout: float = DEFAULT_TIMEOUT, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 max_keepalive_connections: int = DEFAULT_MAX_KEEPALIVE,
                 transport: httpx.AsyncBaseTransport | None = None,
                 pool_shards: int = DEFAULT_POOL_SHARDS) -> None:
        self._t = Transport(base_url, api_key, timeout=timeout, max_connections=max_connections,
                            max_keepalive_connections=max_keepalive_connections, transport=transport,
                            pool_shards=pool_shards)
        self.base_url = self._t.base_url
        self.sandboxes = Sandboxes(self._t)
        self.checkpoints = Checkpoints(self._t)
        self.model = Model(self._t)
        self.envs = Envs(self._t)
        self.images = Images(self._t)

    @property
    def http(self) -> httpx.AsyncClient:
        """The first of the underlying httpx clients (the pool's shards)."""
        return self._t.http

    async def pools(self) -> list[Pool]:
        """The configured pools and their counts."""
        d = await self._t.json("GET", "/v1/pools")
        return [build(Pool, p) for p in (d or {}).get("pools") or []]

    async def classes(self) -> list[Class]:
        """The pool classes of on-demand pools: what ``sandboxes.create(image=...)``
        may ask for (images, sizes and their bounds); empty when the gateway
        serves no image on demand."""
        d = await self._t.json("GET", "/v1/pools")
        return [build(Class, c) for c in (d or {}).get("classes") or []]

    async def whoami(self) -> str:
        """This API key's owner id, which the operator's rules name
        (QUARRY_IMAGE_ALLOW's OWNER=PATTERN, QUARRY_IMAGE_BUILD_KEYS)."""
        d = await self._t.json("GET", "/v1/whoami")
        return str((d or {}).get("owner", ""))

    async def health(self) -> bool:
        """True when the gateway answers /healthz."""
        await self._t.request("GET", "/healthz")
        return True

    async def aclose(self) -> None:
        await self._t.aclose()

    async def __aenter__(self) -> AsyncQuarry:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


__all__ = ["AsyncQuarry", "Checkpoints", "_drop_none"]
