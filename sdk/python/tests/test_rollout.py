"""The rollout example (examples/python/rollout.py) with 32 episodes at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from gateway import ROOT, Gateway


def test_rollout_32_episodes(gw: Gateway, sandbox_pythonpath: str) -> None:
    env = dict(os.environ, QUARRY_URL=gw.url, QUARRY_API_KEY=gw.key,
               PYTHONPATH=str(ROOT / "sdk" / "python" / "src"))
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "python" / "rollout.py"), "--episodes", "32",
                          "--sandbox-pythonpath", sandbox_pythonpath], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout.strip().splitlines()[-1])
    assert s["episodes"] == 32 and s["agent_exits"] == [0] * 32
    # The verifier rewards the clean policy's answers and rejects the noisy one's (every fourth).
    assert s["rewards"] == [0.0 if i % 4 == 3 else 1.0 for i in range(32)]
    # Every transcript has the agent's two calls: the command, then the answer.
    assert s["exchanges"] == [2] * 32
    assert s["mean_reward"] == 0.75


def test_quickstart_runs(gw: Gateway) -> None:
    env = dict(os.environ, QUARRY_URL=gw.url, QUARRY_API_KEY=gw.key,
               PYTHONPATH=str(ROOT / "sdk" / "python" / "src"))
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "python" / "quickstart.py")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "restored: v1" in out.stdout and "the sync client" in out.stdout
