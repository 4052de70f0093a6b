"""A real Quarry gateway for the SDK's tests and benchmarks: the process
provider, the embedded store, a data dir in a temp dir, a free 127.0.0.1
port, the pools file POOLS (or one of the caller's). :meth:`Gateway.stop`
stops it and every sandbox agent it started, and removes its data dir."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

POOLS = """pools:
  - name: default
    image: host
    min_warm: {min_warm}
    max_total: {max_total}
    default_lease_seconds: 600
    max_lease_seconds: 3600
  - name: tiny
    image: host
    min_warm: 0
    max_total: 1
    default_lease_seconds: 600
# Images on demand: a class on the process provider, which runs no images (a create of an image it
# serves is a 400 naming the providers that do); an image it does not serve is refused (403).
classes:
  - name: host
    images: ["docker.io/library/**"]
    max_total: 4
"""

ENVS = """envs:
  - id: guess
    pool: default
    command: [python3, "{root}/examples/envs/text_game.py"]
  - id: terminal
    pool: default
    command: [python3, "{root}/examples/envs/terminal_task.py"]
    defaults: {{max_steps: 30}}
"""


def build_binaries(out: Path) -> Path:
    """go build the gateway and the agent into out (cached by Go's build cache)."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    subprocess.run(["go", "build", "-o", str(out / "gateway"), "./cmd/gateway"], cwd=ROOT, env=env, check=True)
    env["CGO_ENABLED"] = "0"
    subprocess.run(["go", "build", "-trimpath", "-o", str(out / "execagent"), "./cmd/execagent"], cwd=ROOT,
                   env=env, check=True)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gateway:
    def __init__(self, bin_dir: Path, *, min_warm: int = 2, max_total: int = 64, env: dict[str, str] | None = None,
                 pools: str | None = None) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="quarry-pysdk-"))
        self.data_dir = self.tmp / "data"
        self.data_dir.mkdir()
        self.key = "pysdk-" + os.urandom(12).hex()
        self.other_key = "pysdk-other-" + os.urandom(12).hex()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (self.tmp / "pools.yaml").write_text(pools if pools is not None else POOLS.format(min_warm=min_warm, max_total=max_total))
        (self.tmp / "envs.yaml").write_text(ENVS.format(root=ROOT))
        genv = dict(os.environ)
        genv.update({
            "QUARRY_ADDR": f"127.0.0.1:{self.port}",
            "QUARRY_API_KEYS": f"{self.key},{self.other_key}",
            "QUARRY_DATA_DIR": str(self.data_dir),
            "QUARRY_POOLS_FILE": str(self.tmp / "pools.yaml"),
            "QUARRY_ENVS_FILE": str(self.tmp / "envs.yaml"),
            "QUARRY_AGENT_BINARY": str(bin_dir / "execagent"),
            "QUARRY_PROVIDER": "process",
            "QUARRY_RETRY_AFTER": "1s",
            "QUARRY_MAX_UPLOAD_BODY": str(8 << 20),
            "QUARRY_RECONCILE_INTERVAL": "200ms",
            "QUARRY_REAP_INTERVAL": "200ms",
            "QUARRY_LOG_LEVEL": "warn",
        })
        genv.update(env or {})
        self.log_path = self.tmp / "gateway.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([str(bin_dir / "gateway")], env=genv, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                logs = self.logs()
                self.stop()
                raise RuntimeError(f"gateway exited {self.proc.returncode}: {logs}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("gateway did not answer /healthz within 60s")
            time.sleep(0.1)

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-20000:]
        except OSError:
            return ""

    def agents(self) -> list[int]:
        """Pids of the sandbox agents of this gateway's data dir."""
        want = f"QUARRY_AGENT_WORKDIR={self.data_dir}/".encode()
        out = []
        for e in os.listdir("/proc"):
            if not e.isdigit():
                continue
            try:
                with open(f"/proc/{e}/environ", "rb") as f:
                    if want in f.read():
                        out.append(int(e))
            except OSError:
                continue
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        # Sandboxes outlive their gateway by design: stop this one's (each agent leads its session).
        for pid in self.agents():
            for e in os.listdir("/proc"):
                if e.isdigit():
                    try:
                        if os.getsid(int(e)) == pid:
                            os.kill(int(e), signal.SIGKILL)
                    except OSError:
                        pass
        subprocess.run(["chmod", "-R", "u+w", str(self.tmp)], check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)
