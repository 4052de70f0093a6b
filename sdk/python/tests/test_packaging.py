"""Packaging: pip install ./sdk/python into a fresh venv, a wheel builds, and
mypy (strict) is clean on the package. The build backend and httpx come from
the wheelhouse scripts/python-sdk-deps.sh keeps (QUARRY_SDK_WHEELS), so no
network is needed."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from gateway import ROOT

SDK = ROOT / "sdk" / "python"
WHEELS = Path(os.environ.get("QUARRY_SDK_WHEELS", ROOT / ".cache" / "python-sdk" / "wheels"))


def run(*cmd: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{cmd}:\n{out.stdout}\n{out.stderr}"
    return out


def test_pip_install_into_a_fresh_venv(tmp_path: Path) -> None:
    assert (WHEELS / "hatchling-1.33.0-py3-none-any.whl").exists(), f"no wheelhouse at {WHEELS}: run scripts/python-sdk-deps.sh"
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", str(venv))
    py = str(venv / "bin" / "python")
    # The test venv's pip installs into the fresh one (--python): no pip of its own to bootstrap.
    run(sys.executable, "-m", "pip", "--python", py, "install", "-q", "--disable-pip-version-check", "--no-index",
        "--find-links", str(WHEELS), str(SDK))
    out = run(py, "-c", "import quarry, importlib.resources as r, httpx; "
                        "print(quarry.__version__, (r.files('quarry') / 'py.typed').is_file(), quarry.__file__)",
              cwd=tmp_path)
    version, typed, where = out.stdout.split()
    assert (version, typed) == ("0.1.0", "True") and where.startswith(str(venv))
    # The optional adapters import only their extras' packages, lazily: the core works without them.
    run(py, "-c", "from quarry import AsyncQuarry, Quarry, errors; import quarry.openai_adapter", cwd=tmp_path)


def test_wheel_builds(tmp_path: Path) -> None:
    run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(SDK))
    (wheel,) = tmp_path.glob("quarry_sandbox-0.1.0-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read("quarry_sandbox-0.1.0.dist-info/METADATA").decode()
    assert {"quarry/__init__.py", "quarry/py.typed", "quarry/_sync.py", "quarry/gym.py"} <= names
    assert not any(n.startswith("tests/") for n in names)
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert [r for r in requires if "extra ==" not in r] == ["Requires-Dist: httpx<1,>=0.27"]
    assert "Requires-Python: >=3.10" in meta


def test_mypy_strict_is_clean() -> None:
    cache = Path(os.environ.get("QUARRY_SDK_MYPY_CACHE", ROOT / ".cache" / "python-sdk" / "mypy"))
    out = run(sys.executable, "-m", "mypy", "--cache-dir", str(cache), "src/quarry", cwd=SDK)
    assert "Success: no issues found" in out.stdout
