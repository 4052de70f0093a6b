"""Dependencies outside Python that some tests need, asked for as
internal/testenv asks (the same variables): not asked for, a test is skipped
(pytest.skip says what it needs), or fails under QUARRY_TEST_STRICT=1 (make
test); asked for but not there, it fails."""

from __future__ import annotations

import os
from urllib.parse import quote

import httpx
import pytest

DOCKER_HOW = ("run `make test`, or `scripts/docker-up.sh && scripts/images/build.sh` and set QUARRY_TEST_DOCKER=1")


def strict() -> bool:
    v = os.environ.get("QUARRY_TEST_STRICT", "")
    if v not in ("", "1"):
        pytest.fail(f"QUARRY_TEST_STRICT={v!r}: want 1 (make test sets it) or nothing")
    return v == "1"


def docker_engine() -> httpx.Client:
    """A client of the engine's API at DOCKER_HOST (unix:// or tcp://; default
    unix:///var/run/docker.sock)."""
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if host.startswith("unix://"):
        return httpx.Client(transport=httpx.HTTPTransport(uds=host[len("unix://"):]), base_url="http://docker",
                            timeout=30)
    if host.startswith("tcp://"):
        return httpx.Client(base_url="http://" + host[len("tcp://"):], timeout=30)
    pytest.fail(f"DOCKER_HOST={host}: want unix:// or tcp://")


def docker(*images: str) -> None:
    """Make the test need a Docker engine with images (by name)."""
    what = "a Docker engine and the test images"
    v = os.environ.get("QUARRY_TEST_DOCKER", "")
    if v == "":
        msg = f"needs {what}: {DOCKER_HOW}"
        if strict():
            pytest.fail(msg + " (QUARRY_TEST_STRICT=1: a missing dependency fails)")
        pytest.skip(msg)
    if v != "1":
        pytest.fail(f"QUARRY_TEST_DOCKER={v!r}: want 1")
    with docker_engine() as c:
        try:
            c.get("/_ping").raise_for_status()
        except httpx.HTTPError as e:
            pytest.fail(f"needs {what}: no Docker engine answers: {e} ({DOCKER_HOW})")
        for img in images:
            if c.get(f"/images/{quote(img, safe='/:')}/json").status_code != 200:
                pytest.fail(f"needs {what}: image {img} is not on the engine ({DOCKER_HOW})")
