"""Images on demand: against the real gateway (process provider, whose class
runs no images), what a gateway without a provider that runs images answers;
with scripted answers, what only such a provider gives (pulls, waits, builds)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import aio
from gateway import Gateway

import quarry
from quarry import AsyncQuarry, Image, ImagePage, PrefetchedImage, errors

PROVIDERS_THAT_RUN_IMAGES = "the docker and ecs providers do"


def client(gw: Gateway, key: str | None = None) -> AsyncQuarry:
    return AsyncQuarry(gw.url, key or gw.key)


@aio
async def test_create_of_an_image_is_refused_by_a_class_that_runs_none_and_where_no_class_serves_it(gw: Gateway) -> None:
    async with client(gw) as q:
        with pytest.raises(errors.BadRequest) as bi:
            await q.sandboxes.create(image="python:3.11", retry_timeout=0)
        e = bi.value
        assert (e.status, e.code, e.field) == (400, "bad_request", "image")
        assert 'class "host" runs on the process provider' in e.message and PROVIDERS_THAT_RUN_IMAGES in e.message

        with pytest.raises(errors.ImageNotAllowed) as ni:
            await q.sandboxes.create(image="ghcr.io/team/task:1", retry_timeout=0)
        assert (ni.value.status, ni.value.code) == (403, "image_not_allowed")
        assert isinstance(ni.value, errors.Forbidden)
        assert "no class serves it" in ni.value.message and "host: docker.io/library/**" in ni.value.message

        with pytest.raises(errors.BadRequest) as ci:
            await q.sandboxes.create(image="python:3.11", class_="no-such-class", retry_timeout=0)
        assert ci.value.field == "class" and "configured classes: host" in ci.value.message

        with pytest.raises(errors.BadRequest) as pi:
            await q.sandboxes.create(pool="default", image="python:3.11", retry_timeout=0)
        assert pi.value.field == "image" and "not both" in pi.value.message

        with pytest.raises(errors.BadRequest) as mi:
            await q.sandboxes.create(image="python:3.11", memory="lots", retry_timeout=0)
        assert mi.value.field == "memory"
        assert all(not s.pool.startswith("i-") for s in await q.sandboxes.list())  # nothing was made


@aio
async def test_prefetch_answers_each_image_refused_with_its_error(gw: Gateway) -> None:
    async with client(gw) as q:
        got = await q.images.prefetch(["python:3.11", "ghcr.io/team/task:1", "Not A Ref!"])
        assert [p.image for p in got] == ["python:3.11", "ghcr.io/team/task:1", "Not A Ref!"]
        assert all(p.refused and p.state == "refused" and p.ref == "" and p.pool == "" for p in got)
        served, unserved, malformed = (p.error for p in got)
        assert type(served) is errors.BadRequest and served.status == 400 and served.field == "image"
        assert PROVIDERS_THAT_RUN_IMAGES in served.message
        assert type(unserved) is errors.ImageNotAllowed and unserved.status == 403
        assert type(malformed) is errors.BadRequest and malformed.field == "image"
        assert "is not an image reference" in malformed.message

        one = await q.images.prefetch("ghcr.io/team/task:1")  # one image as a string
        assert len(one) == 1 and isinstance(one[0].error, errors.ImageNotAllowed)

        with pytest.raises(errors.BadRequest) as ei:
            await q.images.prefetch([])
        assert ei.value.field == "images"
        with pytest.raises(errors.BadRequest) as wi:
            await q.images.prefetch(["python:3.11"], warm=-1)
        assert wi.value.field == "warm"

        # wait raises a refused image's error at once, given a prefetch's answer or a reference.
        with pytest.raises(errors.ImageNotAllowed):
            await q.images.wait(got[1])
        with pytest.raises(errors.BadRequest):
            await q.images.wait(["python:3.11"])
        with pytest.raises(errors.ImageNotAllowed):
            await q.images.wait(["ghcr.io/team/task:1", got[0]])


@aio
async def test_images_classes_whoami_and_build_off_by_default(gw: Gateway, tmp_path: Path) -> None:
    async with client(gw) as q, client(gw, gw.other_key) as other:
        assert await q.images.list() == []
        assert await q.images.list_page() == ImagePage(images=[], next=None)
        assert await q.images.list_page(limit=5) == ImagePage(images=[], next=None)

        (host,) = await q.classes()
        assert (host.name, host.provider, host.images, host.max_total, host.tasks) == (
            "host", "process", ["docker.io/library/**"], 4, 0)
        assert host.memory_mib == host.max_memory_mib > 0 and host.cpu > 0
        assert {p.name for p in await q.pools()} == {"default", "tiny"}

        owner, other_owner = await q.whoami(), await other.whoami()
        assert len(owner) == 32 and all(c in "0123456789abcdef" for c in owner) and owner != other_owner
        assert await q.whoami() == owner

        (tmp_path / "Dockerfile").write_text("FROM scratch\n")
        for c, who in ((q, owner), (other, other_owner)):
            with pytest.raises(errors.Forbidden) as fi:
                await c.images.build("team/task:1", tmp_path)
            e = fi.value
            assert (type(e), e.status, e.code) == (errors.Forbidden, 403, "forbidden")
            assert "QUARRY_IMAGE_BUILD_KEYS" in e.message and f"this key's owner id: {who}" in e.message


def test_sync_client_images(gw: Gateway) -> None:
    with quarry.Quarry(gw.url, gw.key) as q:
        assert q.images.list() == [] and q.images.list_page().next is None
        assert q.whoami() and [c.name for c in q.classes()] == ["host"]
        (p,) = q.images.prefetch(["ghcr.io/team/task:1"])
        assert isinstance(p, PrefetchedImage) and isinstance(p.error, errors.ImageNotAllowed)
        with pytest.raises(errors.ImageNotAllowed):
            q.images.wait(p)
        with pytest.raises(errors.BadRequest):
            q.sandboxes.create(image="python:3.11", retry_timeout=0)


# -- scripted answers: what a provider that runs images gives ---------------------------------------


def scripted(answers: dict[str, list[Any]], seen: list[httpx.Request]) -> httpx.MockTransport:
    """A gateway that answers each "METHOD /path" with the next of its answers
    (the last one again once they run out): a JSON body, or an httpx.Response."""
    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        queue = answers[f"{req.method} {req.url.path}"]
        a = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(a, httpx.Response):
            return a
        return httpx.Response(202 if req.url.path == "/v1/images/prefetch" else 200, json=a)
    return httpx.MockTransport(handler)


REF = "docker.io/library/python:3.11"
POOL = "i-abcdefabcdefabcdefabcdef"


def pool_entry(state: str, **kw: Any) -> dict[str, Any]:
    return {"image": REF, "class": "default", "pool": POOL, "pool_state": "active", "state": state,
            "memory_mib": 512, "created_at": "2025-01-02T03:04:05.123456789Z",
            "last_used": "2025-01-02T03:04:06Z", **kw}


@aio
async def test_wait_polls_until_ready_and_reports_progress() -> None:
    seen: list[httpx.Request] = []
    answers: dict[str, list[Any]] = {
        "POST /v1/images/prefetch": [{"images": [{"image": "python:3.11", "ref": REF, "pool": POOL, "state": "queued"}]}],
        "GET /v1/images": [
            {"images": []},
            {"images": [{"image": REF, "state": "pulling", "bytes_done": 25, "bytes_total": 100},
                        {"image": "docker.io/library/other:1", "state": "failed", "reason": "not ours"}]},
            {"images": [pool_entry("ready", pool_state="ended")]},  # an ended pool is not ready yet
            {"images": [pool_entry("ready", size_bytes=4096, acquires=0)]},
        ],
    }
    progress: list[list[tuple[str, float | None]]] = []

    async def on_progress(images: list[Image]) -> None:  # a coroutine function is awaited
        progress.append([(i.state, i.progress) for i in images])
    async with AsyncQuarry("http://gw", "k", transport=scripted(answers, seen)) as q:
        (ready,) = await q.images.wait("python:3.11", interval=0.01, on_progress=on_progress)
    assert progress == [[("queued", None)], [("pulling", 0.25)], [("ready", 1.0)], [("ready", 1.0)]]
    assert ready.ready and (ready.pool, ready.class_, ready.size_bytes, ready.memory_mib) == (POOL, "default", 4096, 512)
    assert ready.created_at is not None and ready.created_at.microsecond == 123456
    assert ready.last_used is not None and ready.last_used.second == 6
    prefetch = json.loads(seen[0].content)
    assert prefetch == {"images": ["python:3.11"]}
    # Each poll asks for the awaited pools and references only, not every page.
    assert all(r.url.params.get_list("pool") == [POOL] and r.url.params.get_list("image") == [REF] for r in seen[1:])


@aio
async def test_wait_raises_image_failed_and_times_out() -> None:
    given = PrefetchedImage(image="python:3.11", ref=REF, pool=POOL, state="queued")
    seen: list[httpx.Request] = []
    failed = {"GET /v1/images": [{"images": [{"image": REF, "state": "failed", "reason": "manifest unknown"}]}]}
    async with AsyncQuarry("http://gw", "k", transport=scripted(failed, seen)) as q:
        with pytest.raises(errors.ImageFailed) as fi:
            await q.images.wait([given], interval=0.01)
    e = fi.value
    assert (e.image, e.reason, e.status) == (REF, "manifest unknown", 0) and "manifest unknown" in str(e)
    assert isinstance(e, errors.QuarryError) and not any(r.method == "POST" for r in seen)

    pulling = {"GET /v1/images": [{"images": [pool_entry("pulling", bytes_done=1)]}]}
    calls: list[int] = []
    async with AsyncQuarry("http://gw", "k", transport=scripted(pulling, seen)) as q:
        with pytest.raises(TimeoutError) as ti:
            await q.images.wait(given, timeout=0.2, interval=0.02, on_progress=lambda images: calls.append(len(images)))
    assert f"{REF} (pulling)" in str(ti.value) and len(calls) >= 2 and set(calls) == {1}


@aio
async def test_list_walks_every_page() -> None:
    seen: list[httpx.Request] = []
    pages = {"GET /v1/images": [{"images": [pool_entry("ready")], "next": "c1"},
                                {"images": [pool_entry("ready", pool="i-2")], "next": "c2"},
                                {"images": []}]}
    async with AsyncQuarry("http://gw", "k", transport=scripted(pages, seen)) as q:
        assert [i.pool for i in await q.images.list()] == [POOL, "i-2"]
        page = await q.images.list_page("c1", limit=7)
    assert [r.url.params.get("cursor") for r in seen] == [None, "c1", "c2", "c1"]
    assert seen[-1].url.params["limit"] == "7" and page == ImagePage(images=[], next=None)


@aio
async def test_create_and_prefetch_send_the_image_class_and_sizes() -> None:
    seen: list[httpx.Request] = []
    answers: dict[str, list[Any]] = {
        "POST /v1/sandboxes": [httpx.Response(201, json={"id": "sbx-1", "pool": POOL, "state": "active"})],
        "POST /v1/images/prefetch": [{"images": []}],
    }
    async with AsyncQuarry("http://gw", "k", transport=scripted(answers, seen)) as q:
        sb = await q.sandboxes.create(image="python:3.11", class_="big", cpu=2, memory="2Gi", disk=1024,
                                      labels={"run": "1"})
        assert sb.info.pool == POOL
        await q.images.prefetch(["python:3.11"], warm=3, class_="big", memory=4096)
        await q.images.prefetch(["python:3.11"])
        with pytest.raises(TypeError, match="memory"):
            await q.sandboxes.create(image="python:3.11", memory=1.5)  # type: ignore[arg-type]
    bodies = [json.loads(r.content) for r in seen]
    assert bodies == [
        {"image": "python:3.11", "class": "big", "cpu": 2, "memory": "2Gi", "disk": 1024, "labels": {"run": "1"}},
        {"images": ["python:3.11"], "class": "big", "memory": 4096, "warm": 3},
        {"images": ["python:3.11"]},
    ]


def ndjson(*events: dict[str, Any]) -> httpx.Response:
    body = b"".join(json.dumps(e).encode() + b"\n" for e in events)
    return httpx.Response(200, content=body, headers={"Content-Type": "application/x-ndjson"})


def tar_names(body: bytes) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(body)) as tf:
        for m in tf.getmembers():
            f = tf.extractfile(m)
            if f is not None:
                out[m.name] = f.read()
    return out


@aio
async def test_build_streams_its_log_and_answers_the_image(tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "build.Dockerfile").write_text("FROM base\nCOPY a.txt /a.txt\n")
    (ctx / "a.txt").write_text("a")
    built = {"image": "quarry-build/0123456789ab/team/task:1", "digest": "sha256:" + "0" * 64, "size_bytes": 1234}
    seen: list[httpx.Request] = []
    answers = {"POST /v1/images/build": [ndjson({"log": "Step 1/2 : FROM base"}, {"log": "step-output"}, built)]}
    logs: list[str] = []
    async with AsyncQuarry("http://gw", "k", transport=scripted(answers, seen)) as q:
        res = await q.images.build("team/task:1", ctx, dockerfile="build.Dockerfile", class_="default", on_log=logs.append)
        # A tar's bytes, a tar file and a binary file of a tar are sent as they are.
        tar = seen[0].content
        (tmp_path / "ctx.tar").write_bytes(tar)
        await q.images.build("team/task:1", tar)
        await q.images.build("team/task:1", tmp_path / "ctx.tar")
        with open(tmp_path / "ctx.tar", "rb") as f:
            await q.images.build("team/task:1", f)
        with pytest.raises(FileNotFoundError):
            await q.images.build("team/task:1", tmp_path / "missing")
    assert (res.image, res.digest, res.size_bytes) == (built["image"], built["digest"], 1234)
    assert logs == ["Step 1/2 : FROM base", "step-output"]
    first = seen[0]
    assert dict(first.url.params) == {"name": "team/task:1", "dockerfile": "build.Dockerfile", "class": "default"}
    assert first.headers["Accept"] == "application/x-ndjson" and first.headers["Content-Type"] == "application/x-tar"
    assert tar_names(tar) == {"build.Dockerfile": b"FROM base\nCOPY a.txt /a.txt\n", "a.txt": b"a"}
    assert [r.content for r in seen[1:]] == [tar, tar, tar]
    assert dict(seen[1].url.params) == {"name": "team/task:1"}


@pytest.mark.parametrize("answer,cls,message", [
    (ndjson({"log": "RUN exit 3"}, {"error": {"status": 422, "code": "build_failed", "message": "step 2: exit code 3"}}),
     errors.BuildFailed, "step 2: exit code 3"),
    (ndjson({"log": "RUN make"}), errors.AgentUnreachable, "ended without its result"),
    (httpx.Response(400, json={"error": {"code": "bad_request", "message": "name: is required"}}),
     errors.BadRequest, "name: is required"),
])
@aio
async def test_build_failures_raise_their_class(answer: httpx.Response, cls: type[errors.QuarryError], message: str) -> None:
    logs: list[str] = []

    async def on_log(line: str) -> None:
        logs.append(line)
    answers = {"POST /v1/images/build": [answer]}
    async with AsyncQuarry("http://gw", "k", transport=scripted(answers, [])) as q:
        with pytest.raises(cls) as ei:
            await q.images.build("x:1", b"tar", on_log=on_log)
    assert type(ei.value) is cls and message in ei.value.message
    if cls is errors.BuildFailed:
        assert ei.value.status == 422 and logs == ["RUN exit 3"]
