"""The SDK's tests run against one real gateway (process provider, embedded
store) started here for the session and stopped at its end. QUARRY_SDK_BIN_DIR
names prebuilt binaries (gateway, execagent); otherwise they are built into a
temp dir."""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from gateway import Gateway, build_binaries  # noqa: E402


@pytest.fixture(scope="session")
def bin_dir() -> Iterator[Path]:
    given = os.environ.get("QUARRY_SDK_BIN_DIR")
    if given:
        yield Path(given)
        return
    with tempfile.TemporaryDirectory(prefix="quarry-pysdk-bin-") as d:
        yield build_binaries(Path(d))


@pytest.fixture(scope="session")
def gw(bin_dir: Path, request: pytest.FixtureRequest) -> Iterator[Gateway]:
    g = Gateway(bin_dir, min_warm=4, max_total=64)
    try:
        yield g
    finally:
        if request.session.testsfailed:
            print("\n--- gateway log (tail) ---\n" + g.logs())
        g.stop()
        left = g.agents()
        assert not left, f"agents left running: {left}"


@pytest.fixture(scope="session")
def sandbox_pythonpath() -> str:
    """Where the openai package imports from, for programs run in sandboxes
    (the process provider runs them with the host's python3)."""
    return sysconfig.get_paths()["purelib"]


def aio(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test on a fresh event loop."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(asyncio.wait_for(fn(*args, **kwargs), 180))
    return run
