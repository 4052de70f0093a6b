"""Images on demand on the Docker provider: a gateway of its own with a class
on Docker (and builds on), its containers labelled with a test gateway id
and removed at the end, with the images it built. Needs the engine and
quarry-test/busybox:latest (testenv.docker)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import testenv
from conftest import aio
from gateway import Gateway

from quarry import AsyncQuarry, errors

BUSYBOX = "quarry-test/busybox:latest"

POOLS = """pools:
  - name: default
    image: host
    min_warm: 0
    max_total: 1
classes:
  - name: docker
    provider: docker
    cpu: 1
    memory: 256Mi
    max_memory: 512Mi
    max_total: 4
    warm_max: 0
    images: ["*"]
"""


class DockerGateway:
    """A gateway whose class runs on Docker; built images are noted for removal."""

    def __init__(self, gw: Gateway, gateway_id: str) -> None:
        self.gw = gw
        self.gateway_id = gateway_id
        self.built: list[str] = []

    def client(self) -> AsyncQuarry:
        return AsyncQuarry(self.gw.url, self.gw.key)

    def containers(self) -> list[str]:
        with testenv.docker_engine() as c:
            filters = '{"label": ["quarry.gateway=%s"]}' % self.gateway_id
            r = c.get("/containers/json", params={"all": "1", "filters": filters})
            r.raise_for_status()
            return [str(x["Id"]) for x in r.json()]

    def remove_all(self) -> None:
        """Force-remove the gateway's containers and the images it built."""
        with testenv.docker_engine() as c:
            for cid in self.containers():
                c.delete(f"/containers/{cid}", params={"force": "1", "v": "1"})
            for img in self.built:
                c.delete(f"/images/{quote(img, safe='/:')}", params={"force": "1"})


@pytest.fixture(scope="module")
def docker_gw(bin_dir: Path, request: pytest.FixtureRequest) -> Iterator[DockerGateway]:
    testenv.docker(BUSYBOX)
    gateway_id = "e2e-" + os.urandom(5).hex()  # scripts/leftovers.sh knows test gateway ids by their form
    g = Gateway(bin_dir, pools=POOLS, env={"QUARRY_GATEWAY_ID": gateway_id, "QUARRY_IMAGE_BUILD_KEYS": "*"})
    d = DockerGateway(g, gateway_id)
    try:
        yield d
    finally:
        if request.session.testsfailed:
            print("\n--- docker gateway log (tail) ---\n" + g.logs())
        g.stop()
        d.remove_all()
        assert d.containers() == [], "containers left after cleanup"


@aio
async def test_sandbox_of_an_image_on_a_docker_class(docker_gw: DockerGateway) -> None:
    async with docker_gw.client() as q:
        assert [(c.name, c.provider) for c in await q.classes()] == [("docker", "docker")]
        (p,) = await q.images.prefetch([BUSYBOX], class_="docker")
        assert p.error is None, f"the prefetch was refused: {p.error}"
        assert p.state in ("queued", "ready")
        assert p.ref == "docker.io/quarry-test/busybox:latest" and p.pool.startswith("i-")
        seen: list[str] = []
        (img,) = await q.images.wait(p, timeout=120, interval=0.2, on_progress=lambda ims: seen.append(ims[0].state))
        assert img.ready and (img.pool, img.image, img.class_, img.memory_mib) == (p.pool, p.ref, "docker", 256)
        assert seen[-1] == "ready"

        async with q.sandboxes.create(image=BUSYBOX, lease_seconds=120) as sb:  # the class's sizes: the pool prefetched
            assert sb.info.pool == p.pool
            r = await sb.exec("echo hi from $(cat /etc/hostname) in $PWD")
            assert r.ok and r.stdout.startswith("hi from ") and r.stdout.endswith(" in /home/sandbox\n")
            assert (await sb.exec(["sh", "-c", "test -e /bin/busybox"])).ok
        assert [i.pool for i in await q.images.list()] == [p.pool]

        with pytest.raises(errors.BadRequest) as bi:  # over the class's max_memory
            await q.sandboxes.create(image=BUSYBOX, memory="1Gi", retry_timeout=0)
        assert bi.value.field == "memory"

        # A registry that does not answer (nothing listens on 127.0.0.1:1): 503, and nothing made.
        with pytest.raises(errors.RegistryUnavailable) as ri:
            await q.sandboxes.create(image="127.0.0.1:1/pysdk/nothing:1", retry_timeout=0)
        assert ri.value.status == 503 and ri.value.retry_after is not None and "127.0.0.1:1" in ri.value.message
        (gone,) = await q.images.prefetch("127.0.0.1:1/pysdk/nothing:1")
        with pytest.raises(errors.ImageFailed) as fi:
            await q.images.wait(gone, timeout=120, interval=0.2)
        assert fi.value.image == "127.0.0.1:1/pysdk/nothing:1" and fi.value.reason
        assert [i.pool for i in await q.images.list() if i.pool] == [p.pool]


@aio
async def test_build_an_image_and_run_it(docker_gw: DockerGateway, tmp_path: Path) -> None:
    (tmp_path / "hello.txt").write_text("hello from the build\n")
    (tmp_path / "Dockerfile").write_text(f"FROM {BUSYBOX}\nCOPY hello.txt /hello.txt\nRUN echo step-output\n")
    (tmp_path / "bad.Dockerfile").write_text(f"FROM {BUSYBOX}\nRUN echo failing-step && exit 3\n")
    async with docker_gw.client() as q:
        owner = await q.whoami()
        logs: list[str] = []
        res = await q.images.build("pysdk-test/hello:1", tmp_path, on_log=logs.append)
        docker_gw.built.append(res.image)
        assert res.image == f"quarry-build/{owner[:12]}/pysdk-test/hello:1"
        assert res.digest.startswith("sha256:") and res.size_bytes > 0
        assert any("step-output" in line for line in logs)

        async with q.sandboxes.create(image=res.image, retry_timeout=0) as sb:
            assert (await sb.exec("cat /hello.txt")).stdout == "hello from the build\n"

        logs.clear()
        with pytest.raises(errors.BuildFailed) as bi:
            await q.images.build("pysdk-test/bad:1", tmp_path, dockerfile="bad.Dockerfile", on_log=logs.append)
        assert bi.value.status == 422 and bi.value.code == "build_failed" and bi.value.message
        assert any("failing-step" in line for line in logs)
