"""The error classes (every code the gateway answers) and create's retries:
503 after Retry-After with one Idempotency-Key, nothing else retried."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from pathlib import Path

import httpx
import pytest
from conftest import aio
from gateway import ROOT, Gateway

from quarry import AsyncQuarry, errors

# Every code of api.Codes() (api/errors.go), with its status and class.
CODES = [
    (400, "bad_request", errors.BadRequest), (400, "invalid_action", errors.InvalidAction),
    (401, "unauthorized", errors.Unauthorized), (403, "forbidden", errors.Forbidden),
    (403, "image_not_allowed", errors.ImageNotAllowed), (403, "image_denied", errors.ImageDenied),
    (404, "not_found", errors.NotFound), (404, "image_not_found", errors.ImageNotFound),
    (405, "method_not_allowed", errors.MethodNotAllowed),
    (409, "conflict", errors.Conflict), (409, "busy", errors.Busy), (409, "name_in_use", errors.NameInUse),
    (409, "process_exited", errors.ProcessExited), (409, "no_reply", errors.NoReply),
    (409, "protocol_error", errors.ProtocolError), (409, "episode_not_running", errors.EpisodeNotRunning),
    (410, "gone", errors.Gone), (413, "payload_too_large", errors.PayloadTooLarge),
    (422, "command_failed", errors.CommandFailed), (422, "build_failed", errors.BuildFailed),
    (429, "quota_exceeded", errors.QuotaExceeded),
    (500, "internal", errors.Internal),
    (500, "checkpoint_corrupt", errors.CheckpointCorrupt), (502, "agent_unreachable", errors.AgentUnreachable),
    (502, "upstream_unreachable", errors.UpstreamUnreachable), (502, "port_closed", errors.PortClosed),
    (502, "env_error", errors.EnvError),
    (503, "unavailable", errors.Unavailable), (503, "no_capacity", errors.NoCapacity),
    (503, "pids_limit", errors.PidsLimit), (503, "registry_unavailable", errors.RegistryUnavailable),
    (504, "timeout", errors.Timeout), (504, "env_timeout", errors.EnvTimeout),
    (507, "insufficient_storage", errors.InsufficientStorage),
]


def mock(status: int, code: str, message: str = "m", headers: dict[str, str] | None = None) -> httpx.MockTransport:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"error": {"code": code, "message": message}}, headers=headers)
    return httpx.MockTransport(handler)


@pytest.mark.parametrize("status,code,cls", CODES, ids=[c for _, c, _ in CODES])
@aio
async def test_each_code_has_its_class(status: int, code: str, cls: type[errors.QuarryError]) -> None:
    async with AsyncQuarry("http://gw", "k", transport=mock(status, code, "what: went wrong")) as q:
        with pytest.raises(cls) as ei:
            await q.sandboxes.attach("sbx-1").kill_all()
    e = ei.value
    assert type(e) is cls and (e.status, e.code, e.message) == (status, code, "what: went wrong")
    assert isinstance(e, errors.QuarryError)


def test_every_code_of_the_openapi_document_has_its_class() -> None:
    # gateway/openapi.json's Error.code enum is every code the gateway answers.
    doc = json.loads((ROOT / "gateway" / "openapi.json").read_text())
    codes = doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"]
    assert len(codes) > 10
    missing = [c for c in codes if errors.class_for(c, 0) is errors.QuarryError]
    assert not missing, f"codes of gateway/openapi.json without a class in quarry.errors: {missing}"
    assert all(errors.class_for(c, 0).code == c for c in codes)
    tabled = {code for _, code, _ in CODES}
    assert set(codes) <= tabled, f"codes missing from CODES: {set(codes) - tabled}"
    # Every class is exported by name.
    assert all(cls.__name__ in errors.__all__ for _, _, cls in CODES)


@aio
async def test_registry_unavailable_is_retryable_like_every_503() -> None:
    calls: list[str | None] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req.headers.get("Idempotency-Key"))
        if len(calls) == 1:
            return httpx.Response(503, json={"error": {"code": "registry_unavailable", "message": "registry down"}},
                                  headers={"Retry-After": "0"})
        return httpx.Response(201, json={"id": "sbx-1", "pool": "i-x", "state": "active"})
    async with AsyncQuarry("http://gw", "k", transport=httpx.MockTransport(handler)) as q:
        sb = await q.sandboxes.create(image="python:3.11", retry_timeout=5)
    assert sb.id == "sbx-1" and len(calls) == 2 and calls[0] == calls[1]


@aio
async def test_unknown_code_falls_back_to_status_and_non_json_bodies() -> None:
    async with AsyncQuarry("http://gw", "k", transport=mock(409, "something_new")) as q:
        with pytest.raises(errors.Conflict) as ei:
            await q.pools()
    assert ei.value.code == "something_new"

    def text(req: httpx.Request) -> httpx.Response:
        return httpx.Response(502, text="<html>bad gateway</html>")
    async with AsyncQuarry("http://gw", "k", transport=httpx.MockTransport(text)) as q:
        with pytest.raises(errors.AgentUnreachable) as ai:
            await q.pools()
    assert "bad gateway" in ai.value.message


@aio
async def test_stream_error_event_raises_its_class() -> None:
    def sse(req: httpx.Request) -> httpx.Response:
        body = 'event: stdout\ndata: {"data": "x"}\n\nevent: error\ndata: {"code": "agent_unreachable", "message": "lost"}\n\n'
        return httpx.Response(200, content=body.encode(), headers={"Content-Type": "text/event-stream"})
    async with AsyncQuarry("http://gw", "k", transport=httpx.MockTransport(sse)) as q:
        got = []
        with pytest.raises(errors.AgentUnreachable) as ei:
            async for e in q.sandboxes.attach("sbx-1").exec_stream("x"):
                got.append(e.data)
    assert got == ["x"] and ei.value.status == 0 and ei.value.message == "lost"


class Recorder(httpx.AsyncBaseTransport):
    """The real transport, noting each create's Idempotency-Key."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.keys: list[str | None] = []
        self.answers: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        resp = await self.inner.handle_async_request(request)
        if request.method == "POST" and request.url.path in ("/v1/sandboxes", "/v1/envs"):
            self.keys.append(request.headers.get("Idempotency-Key"))
            self.answers.append(resp.status_code)
        return resp

    async def aclose(self) -> None:
        await self.inner.aclose()


@aio
async def test_no_capacity_retry_after_and_create_retries_with_one_key(gw: Gateway) -> None:
    rec = Recorder()
    async with AsyncQuarry(gw.url, gw.key, transport=rec) as q:
        holder = await q.sandboxes.create(pool="tiny")  # max_total 1
        with pytest.raises(errors.NoCapacity) as ni:
            await q.sandboxes.create(pool="tiny", retry_timeout=0)
        assert ni.value.status == 503 and ni.value.retry_after == 1.0
        assert isinstance(ni.value, errors.Unavailable)

        rec.keys.clear()
        rec.answers.clear()

        async def release_later() -> None:
            await asyncio.sleep(2.5)
            await holder.release()
        task = asyncio.create_task(release_later())
        sb = await q.sandboxes.create(pool="tiny", retry_timeout=30)
        await task
        assert sb.info.state == "active"
        assert len(rec.keys) >= 2 and len(set(rec.keys)) == 1 and rec.keys[0]
        assert rec.answers[:-1] == [503] * (len(rec.answers) - 1) and rec.answers[-1] == 201
        await sb.release()

        # Not a 503: raised at once, never retried.
        rec.keys.clear()
        with pytest.raises(errors.BadRequest):
            await q.sandboxes.create(pool="tiny", lease_seconds=999999, retry_timeout=30)
        assert len(rec.keys) == 1


@aio
async def test_idempotency_key_returns_the_same_sandbox(gw: Gateway) -> None:
    async with AsyncQuarry(gw.url, gw.key) as q:
        a = await q.sandboxes.create(idempotency_key="py-test-same-key")
        b = await q.sandboxes.create(idempotency_key="py-test-same-key")
        assert a.id == b.id
        with pytest.raises(errors.Conflict):
            await q.sandboxes.create(idempotency_key="py-test-same-key", labels={"other": "x"})
        await a.release()


@aio
async def test_connection_pool_is_sized_for_thousands() -> None:
    # The pool's limits are the client's own (not httpx's default of 100).
    q = AsyncQuarry("http://gw", "k")
    pools = [c._transport._pool for c in q._t.shards]  # type: ignore[attr-defined]
    assert len(pools) == 16
    assert sum(p._max_connections for p in pools) == 4096 and sum(p._max_keepalive_connections for p in pools) == 1024
    # A sandbox's calls always take the same shard.
    t = q._t
    assert t._shard("/v1/sandboxes/sbx-a/exec") is t._shard("/v1/sandboxes/sbx-a/sessions/s/run")
    assert len({id(t._shard(f"/v1/sandboxes/sbx-{i}")) for i in range(200)}) > 8
    await q.aclose()


@aio
async def test_configured_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(200, json={"pools": [{"name": "p", "ready": 3}]})
    monkeypatch.setenv("QUARRY_URL", "http://env-gateway:9/")
    monkeypatch.setenv("QUARRY_API_KEY", "env-key")
    async with AsyncQuarry(transport=httpx.MockTransport(handler)) as q:
        pools = await q.pools()
    assert pools[0].name == "p" and pools[0].ready == 3
    assert str(seen[0].url) == "http://env-gateway:9/v1/pools"
    assert seen[0].headers["Authorization"] == "Bearer env-key"


@aio
async def test_download_dir_refuses_entries_outside_the_target(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        data = b"evil"
        info = tarfile.TarInfo("../escaped.txt")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))

    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=buf.getvalue())
    async with AsyncQuarry("http://gw", "k", transport=httpx.MockTransport(handler)) as q:
        with pytest.raises(ValueError, match="outside"):
            await q.sandboxes.attach("sbx-1").files.download_dir("d", tmp_path / "out")
    assert not (tmp_path / "escaped.txt").exists()
