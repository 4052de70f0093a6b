"""The env API (docs/ENVS.md): Gym-style reset and step of env programs in
sandboxes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import errors
from ._http import Transport, sandbox_path
from ._sandbox import Sandbox, _drop_none, _Opening, create_with_retry, lease_request
from .types import Checkpoint, EnvInfo, SandboxInfo, build


class Env:
    """An env in its own sandbox: ``reset`` → ``(obs, info)``, ``step`` →
    ``(obs, reward, terminated, truncated, info)``, ``close`` (releases the
    sandbox). ``async with`` closes it."""

    def __init__(self, t: Transport, env_id: str, sandbox_id: str) -> None:
        self._t = t
        self.env_id = env_id
        self.sandbox_id = sandbox_id
        self.sandbox = Sandbox(t, SandboxInfo(id=sandbox_id))
        self.closed = False

    def __repr__(self) -> str:
        return f"Env({self.env_id!r}, sandbox={self.sandbox_id!r})"

    async def reset(self, seed: int | None = None, options: Mapping[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Start an episode. options["checkpoint"] restores that checkpoint first."""
        body = _drop_none({"seed": seed, "options": dict(options) if options else None})
        d = await self.sandbox._json("POST", "env", "reset", json_body=body, timeout=600.0)
        return d.get("observation"), dict(d.get("info") or {})

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        d = await self.sandbox._json("POST", "env", "step", json_body={"action": action}, timeout=600.0)
        return (d.get("observation"), float(d.get("reward") or 0.0), bool(d.get("terminated")),
                bool(d.get("truncated")), dict(d.get("info") or {}))

    async def close(self) -> None:
        """End the env and release its sandbox (again: nothing)."""
        if self.closed:
            return
        try:
            await self._t.json("POST", sandbox_path(self.sandbox_id, "env", "close"))
        except errors.Gone:
            pass
        self.closed = True

    async def __aenter__(self) -> Env:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Envs:
    """``q.envs``: the registry's envs, and making one."""

    def __init__(self, t: Transport) -> None:
        self._t = t

    async def list(self) -> list[EnvInfo]:
        d = await self._t.json("GET", "/v1/envs")
        return [build(EnvInfo, e) for e in (d or {}).get("envs") or []]

    def make(self, env_id: str, *, lease_seconds: int | None = None, env: Mapping[str, str] | None = None,
             labels: Mapping[str, str] | None = None, from_checkpoint: str | Checkpoint | None = None,
             idempotency_key: str | None = None, retry_timeout: float = 60.0) -> _Opening[Env]:
        """A sandbox of the env's pool with its program started (await it, or
        ``async with`` it). 503s are retried as for sandboxes.create."""
        body = lease_request({"env_id": env_id}, lease_seconds, env, labels, from_checkpoint)

        async def make() -> Env:
            d = await create_with_retry(self._t, "/v1/envs", body, idempotency_key, retry_timeout)
            return Env(self._t, str(d.get("env_id", env_id)), str(d["sandbox_id"]))
        return _Opening(make())

    def attach(self, env_id: str, sandbox_id: str) -> Env:
        return Env(self._t, env_id, sandbox_id)
