"""The rollout example (examples/python/rollout.py) with 32 episodes at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gateway import ROOT, Gateway


def rollout(gw: Gateway, *args: str) -> subprocess.CompletedProcess[str]:
    """examples/python/rollout.py against gw, as its docstring runs it: with
    this venv's python (the SDK and its openai extra)."""
    env = dict(os.environ, QUARRY_URL=gw.url, QUARRY_API_KEY=gw.key,
               PYTHONPATH=str(ROOT / "sdk" / "python" / "src"))
    return subprocess.run([sys.executable, str(ROOT / "examples" / "python" / "rollout.py"), *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_rollout_32_episodes(gw: Gateway, sandbox_pythonpath: str) -> None:
    # The docstring's command: --sandbox-pythonpath is the venv's purelib, where the extra put openai.
    out = rollout(gw, "--episodes", "32", "--sandbox-pythonpath", sandbox_pythonpath)
    assert out.returncode == 0, out.stderr
    assert "failed" not in out.stderr
    s = json.loads(out.stdout.strip().splitlines()[-1])
    assert s["episodes"] == 32 and s["agent_exits"] == [0] * 32
    # The verifier rewards the clean policy's answers and rejects the noisy one's (every fourth).
    assert s["rewards"] == [0.0 if i % 4 == 3 else 1.0 for i in range(32)]
    # Every transcript has the agent's two calls: the command, then the answer.
    assert s["exchanges"] == [2] * 32
    assert s["mean_reward"] == 0.75


def test_rollout_every_episode_failed_exits_1_and_says_why(gw: Gateway, tmp_path: Path) -> None:
    # A sandbox python3 whose openai does not import, whatever the host has installed: an empty
    # package of that name first on its path.
    (tmp_path / "openai").mkdir()
    (tmp_path / "openai" / "__init__.py").write_text("")
    out = rollout(gw, "--episodes", "3", "--sandbox-pythonpath", str(tmp_path))
    assert out.returncode == 1, out.stdout + out.stderr
    s = json.loads(out.stdout.strip().splitlines()[-1])
    assert s["agent_exits"] == [1, 1, 1] and s["mean_reward"] == 0.0
    # The reason is on stderr: the first failure's stderr tail, and what to do about it.
    assert "rollout: 3 of 3 episodes failed; the first, episode 0, exited 1" in out.stderr
    assert "ImportError: cannot import name 'OpenAI' from 'openai'" in out.stderr
    assert "--sandbox-pythonpath" in out.stderr
    assert "Traceback" not in out.stderr.split("its stderr ends:")[0], out.stderr


def test_quickstart_runs(gw: Gateway) -> None:
    env = dict(os.environ, QUARRY_URL=gw.url, QUARRY_API_KEY=gw.key,
               PYTHONPATH=str(ROOT / "sdk" / "python" / "src"))
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "python" / "quickstart.py")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "restored: v1" in out.stdout and "the sync client" in out.stdout
