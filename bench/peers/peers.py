#!/usr/bin/env python3
"""Side-by-side session round trips: Quarry's exec agent against peer agents.

Starts each agent's in-sandbox HTTP server on 127.0.0.1, creates one bash
session in it, warms up, then runs the no-op command `true` sequentially over
one keep-alive connection and records the latency of every call. The same
client (the standard library's http.client) talks to every agent, so the
numbers differ only by what the agents do.

Agents:
  quarry   Quarry's exec agent, the binary given by --quarry-agent.
  swe-rex  SWE-ReX's `swerex-remote` (PyPI package swe-rex), from --venv.
  rocklet  ROCK's `rocklet` (PyPI package rl-rock, extra "rocklet"), from --venv.

A peer that cannot be started or called is reported as not run, with the
error seen, and the run goes on. A failure of Quarry's agent is exit 1.
Exit 2 is a usage error. scripts/bench-peers.sh installs the peers and runs
this file; see bench/peers/README.md.

This file uses only the standard library, so it runs (and reports why the
peers could not) even when installing the peers failed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import platform
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

SCHEMA = "quarry.bench.peers/v1"
COMMAND = "true"
AGENT_NAMES = ("quarry", "swe-rex", "rocklet")
PEER_NAMES = AGENT_NAMES[1:]
GOAL_RATIO = 10.0

# Bounds: every wait has a deadline and every body a size limit.
START_TIMEOUT_S = 60.0  # server process start until it answers its health route
CALL_TIMEOUT_S = 30.0  # one HTTP call (socket timeout)
RUN_TIMEOUT_S = 30  # the command timeout sent to the agent
STOP_TIMEOUT_S = 10.0  # SIGTERM until SIGKILL
MAX_BODY_BYTES = 1 << 20  # an answer larger than this fails the agent
LOG_TAIL_BYTES = 2000  # how much of a server log goes into a failure reason
SESSION = "quarry-bench"  # session name for peers that take one from the caller

# Installed distributions whose versions are recorded for the peers.
PEER_DISTRIBUTIONS = ("swe-rex", "rl-rock", "fastapi", "uvicorn", "starlette", "pydantic", "pexpect")


class AgentError(Exception):
    """An agent could not be started or answered wrongly; the message says what was seen."""


class TransportError(AgentError):
    """The HTTP exchange itself failed (connection refused or reset, timeout, bad framing)."""


# ---------------------------------------------------------------- statistics


@dataclass
class Stats:
    """Summary of one series of latencies, in milliseconds."""

    calls: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    rps: float  # calls per second of wall time of the measured loop

    def as_dict(self) -> dict[str, Any]:
        """Returns the fields rounded for JSON (3 decimals for ms, 1 for rps)."""
        return {
            "calls": self.calls,
            "p50_ms": round(self.p50_ms, 3),
            "p90_ms": round(self.p90_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "mean_ms": round(self.mean_ms, 3),
            "min_ms": round(self.min_ms, 3),
            "max_ms": round(self.max_ms, 3),
            "rps": round(self.rps, 1),
        }


def percentile(sorted_values: list[float], p: float) -> float:
    """Returns the nearest-rank p-th percentile (0 < p <= 100) of an ascending list.

    Raises ValueError for an empty list or p outside (0, 100].
    """
    if not sorted_values:
        raise ValueError("percentile: no values")
    if not 0 < p <= 100:
        raise ValueError(f"percentile: p must be in (0, 100], got {p}")
    rank = math.ceil(p / 100 * len(sorted_values))
    return sorted_values[max(rank, 1) - 1]


def summarize(latencies_ms: list[float], wall_s: float) -> Stats:
    """Summarizes per-call latencies measured over wall_s seconds of sequential calls.

    Raises ValueError when there are no latencies or wall_s is not positive.
    """
    if not latencies_ms:
        raise ValueError("summarize: no latencies")
    if wall_s <= 0:
        raise ValueError(f"summarize: wall time must be positive, got {wall_s}")
    s = sorted(latencies_ms)
    return Stats(
        calls=len(s),
        p50_ms=percentile(s, 50),
        p90_ms=percentile(s, 90),
        p99_ms=percentile(s, 99),
        mean_ms=sum(s) / len(s),
        min_ms=s[0],
        max_ms=s[-1],
        rps=len(s) / wall_s,
    )


def ratios(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Returns, for each peer that ran, peer/quarry ratios of p50, p99 and mean latency.

    Empty when Quarry's agent did not run. A ratio above 1 means Quarry is faster;
    meets_goal says whether the p50 ratio reaches GOAL_RATIO.
    """
    by_name = {r["name"]: r for r in results}
    quarry = by_name.get("quarry")
    if not quarry or quarry.get("status") != "ok":
        return {}
    q = quarry["session_run"]
    out: dict[str, dict[str, Any]] = {}
    for name in PEER_NAMES:
        peer = by_name.get(name)
        if not peer or peer.get("status") != "ok":
            continue
        p = peer["session_run"]
        p50 = p["p50_ms"] / q["p50_ms"]
        out[name] = {
            "p50": round(p50, 1),
            "p99": round(p["p99_ms"] / q["p99_ms"], 1),
            "mean": round(p["mean_ms"] / q["mean_ms"], 1),
            "goal": GOAL_RATIO,
            "meets_goal": p50 >= GOAL_RATIO,
        }
    return out


# ---------------------------------------------------------------- HTTP client


class NoDelayConnection(http.client.HTTPConnection):
    """An HTTPConnection with TCP_NODELAY set, as urllib3 (requests) and httpx set it."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Client:
    """One keep-alive HTTP/1.1 connection to an agent on 127.0.0.1.

    Not safe for concurrent use. Every call has a socket timeout of
    CALL_TIMEOUT_S and reads at most MAX_BODY_BYTES.
    """

    def __init__(self, port: int, headers: dict[str, str]):
        self._conn = NoDelayConnection("127.0.0.1", port, timeout=CALL_TIMEOUT_S)
        self._headers = dict(headers)

    def close(self) -> None:
        """Closes the connection; idempotent."""
        self._conn.close()

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        """Sends one request and returns status and raw body. A body that is not
        None is sent as JSON: bytes as they are (already encoded), anything else
        encoded here.

        Raises AgentError on a transport error or an answer over MAX_BODY_BYTES.
        """
        headers = dict(self._headers)
        payload = None
        if body is not None:
            payload = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            self._conn.request(method, path, body=payload, headers=headers)
            resp = self._conn.getresponse()
            length = resp.getheader("Content-Length")
            if length is not None and int(length) > MAX_BODY_BYTES:
                raise AgentError(f"{method} {path}: answer of {length} bytes exceeds {MAX_BODY_BYTES}")
            data = resp.read(MAX_BODY_BYTES + 1)
            if len(data) > MAX_BODY_BYTES:
                raise AgentError(f"{method} {path}: answer exceeds {MAX_BODY_BYTES} bytes")
            if not resp.isclosed():
                # A chunked answer can leave its terminator unread; finish it so
                # the connection is reusable.
                resp.read()
            return resp.status, data
        except AgentError:
            self._conn.close()
            raise
        except (OSError, http.client.HTTPException, ValueError) as e:
            self._conn.close()
            raise TransportError(f"{method} {path}: {type(e).__name__}: {e}") from e

    def json_call(self, method: str, path: str, body: Any = None, want: tuple[int, ...] = (200,)) -> Any:
        """Like call, and decodes the JSON answer; raises AgentError unless the status is in want."""
        status, data = self.call(method, path, body)
        return decode_answer(method, path, status, data, want)


def decode_answer(method: str, path: str, status: int, data: bytes, want: tuple[int, ...] = (200,)) -> Any:
    """Decodes a JSON answer; raises AgentError naming the route when the status is not
    in want or the body is not JSON (the message carries the start of the body)."""
    if status not in want:
        raise AgentError(f"{method} {path}: status {status}, want {'/'.join(map(str, want))}: {snippet(data)}")
    try:
        return json.loads(data)
    except ValueError as e:
        raise AgentError(f"{method} {path}: answer is not JSON ({e}): {snippet(data)}") from e


def snippet(data: bytes, limit: int = 300) -> str:
    """Returns the start of a body as text, for error messages."""
    text = data[:limit].decode(errors="replace")
    return text + ("…" if len(data) > limit else "")


# ---------------------------------------------------------------- agents


@dataclass
class Agent:
    """How to start one agent and call its session routes.

    argv/env start the server; find_port reads its bound port once it listens
    (from the agent's log or address file). The *_req fields are
    (method, path, body) builders; check_run raises AgentError when a run
    answer is not a successful `true`.
    """

    name: str
    argv: list[str]
    env: dict[str, str]
    headers: dict[str, str]
    find_port: Callable[[], int | None]
    health_path: str
    check_health: Callable[[Any], None]
    create_req: tuple[str, str, Any]
    session_ref: Callable[[Any], str]
    run_req: Callable[[str], tuple[str, str, Any]]
    check_run: Callable[[Any], None]
    close_req: Callable[[str], tuple[str, str, Any]]
    version: str = ""
    notes: list[str] = field(default_factory=list)


UVICORN_PORT = re.compile(rb"Uvicorn running on http://127\.0\.0\.1:(\d+)")


def uvicorn_port(log_path: str) -> Callable[[], int | None]:
    """Returns a probe that finds the port uvicorn reports in its log (bound with --port 0)."""

    def probe() -> int | None:
        try:
            with open(log_path, "rb") as f:
                m = UVICORN_PORT.search(f.read(1 << 20))
        except FileNotFoundError:
            return None
        return int(m.group(1)) if m else None

    return probe


def addr_file_port(path: str) -> Callable[[], int | None]:
    """Returns a probe that reads the port from an address file ("127.0.0.1:PORT").

    Raises AgentError when the file holds an address that is not on 127.0.0.1.
    """

    def probe() -> int | None:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read(256).strip()
        except FileNotFoundError:
            return None
        if not text:
            return None
        hostport = text.removeprefix("http://").rstrip("/")
        host, _, port = hostport.rpartition(":")
        if host not in ("127.0.0.1", "localhost") or not port.isdigit():
            raise AgentError(f"address file {path}: want 127.0.0.1:PORT, got {text!r}")
        return int(port)

    return probe


def check_exit_zero(field_name: str = "exit_code") -> Callable[[Any], None]:
    """Returns a check that a run answer is a JSON object with field_name == 0."""

    def check(answer: Any) -> None:
        if not isinstance(answer, dict) or answer.get(field_name) != 0:
            raise AgentError(f"run `{COMMAND}`: want {field_name} 0, got {json.dumps(answer)[:300]}")

    return check


def check_status_ok(answer: Any) -> None:
    """Checks a Quarry /healthz answer."""
    if not isinstance(answer, dict) or answer.get("status") != "ok":
        raise AgentError(f"healthz: want status ok, got {json.dumps(answer)[:300]}")


def check_is_alive(answer: Any) -> None:
    """Checks a peer /is_alive answer."""
    if not isinstance(answer, dict) or answer.get("is_alive") is not True:
        raise AgentError(f"is_alive: want is_alive true, got {json.dumps(answer)[:300]}")


def quarry_agent(binary: str, work: str) -> Agent:
    """Describes Quarry's exec agent: bearer token, address file, /v1/sessions routes."""
    token = secrets.token_hex(16)
    addr_file = os.path.join(work, "quarry-agent.addr")
    env = {
        "QUARRY_AGENT_ADDR": "127.0.0.1:0",
        "QUARRY_AGENT_TOKEN": token,
        "QUARRY_AGENT_ADDR_FILE": addr_file,
    }

    def session_ref(answer: Any) -> str:
        if not isinstance(answer, dict) or not isinstance(answer.get("id"), str) or not answer["id"]:
            raise AgentError(f"create session: want an id, got {json.dumps(answer)[:300]}")
        return answer["id"]

    return Agent(
        name="quarry",
        argv=[binary],
        env=env,
        headers={"Authorization": f"Bearer {token}"},
        find_port=addr_file_port(addr_file),
        health_path="/healthz",
        check_health=check_status_ok,
        create_req=("POST", "/v1/sessions", {}),
        session_ref=session_ref,
        run_req=lambda sid: (
            "POST",
            f"/v1/sessions/{sid}/run",
            {"command": COMMAND, "timeout_ms": RUN_TIMEOUT_S * 1000},
        ),
        check_run=check_exit_zero(),
        close_req=lambda sid: ("DELETE", f"/v1/sessions/{sid}", None),
    )


def uvicorn_peer(
    name: str, argv: list[str], headers: dict[str, str], log_path: str,
    every_body: dict[str, Any], create_extra: dict[str, Any],
) -> Agent:
    """Describes a peer of the SWE-ReX server lineage (rocklet grew out of it): a
    uvicorn app on the port given by --port (0 here, read back from its log),
    GET /is_alive, and POST /create_session, /run_in_session, /close_session
    whose session is named by the caller. every_body is added to each body,
    create_extra to the create body."""

    def body(**fields: Any) -> dict[str, Any]:
        return {**fields, **every_body}

    return Agent(
        name=name,
        argv=argv,
        env={},
        headers=headers,
        find_port=uvicorn_port(log_path),
        health_path="/is_alive",
        check_health=check_is_alive,
        create_req=("POST", "/create_session", {**body(session_type="bash", session=SESSION), **create_extra}),
        session_ref=lambda _answer: SESSION,
        run_req=lambda sid: (
            "POST",
            "/run_in_session",
            body(action_type="bash", session=sid, command=COMMAND, timeout=RUN_TIMEOUT_S, check="raise"),
        ),
        check_run=check_exit_zero(),
        close_req=lambda sid: ("POST", "/close_session", body(session_type="bash", session=sid)),
    )


def swerex_agent(venv: str, log_path: str) -> Agent:
    """Describes SWE-ReX's swerex-remote: an X-API-Key token (the server requires one)."""
    token = secrets.token_hex(16)
    argv = [os.path.join(venv, "bin", "swerex-remote"), "--host", "127.0.0.1", "--port", "0", "--auth-token", token]
    return uvicorn_peer("swe-rex", argv, {"X-API-Key": token}, log_path, every_body={}, create_extra={})


def rocklet_agent(venv: str, log_path: str) -> Agent:
    """Describes ROCK's rocklet: no authentication; every body names the sandbox, and the
    session inherits the server's environment (env_enable, as ROCK's SDK asks)."""
    argv = [os.path.join(venv, "bin", "rocklet"), "--host", "127.0.0.1", "--port", "0"]
    return uvicorn_peer(
        "rocklet", argv, {}, log_path, every_body={"sandbox_id": SESSION}, create_extra={"env_enable": True}
    )


# ---------------------------------------------------------------- processes


def proc_children() -> dict[int, list[int]]:
    """Returns the parent → children map of the processes visible in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: split after it.
        fields = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def descendants(pid: int) -> list[int]:
    """Returns every descendant of pid (children first)."""
    tree = proc_children()
    out: list[int] = []
    todo = list(tree.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(tree.get(p, []))
    return out


def start_time(pid: int) -> int | None:
    """Returns a process's start time in clock ticks (field 22 of /proc/PID/stat), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rfind(b")") + 2 :].split()[19])


class Server:
    """A running agent process, with its log file; stop() ends it and everything it started."""

    def __init__(self, agent: Agent, log_path: str, cwd: str):
        self.agent = agent
        self.log_path = log_path
        env = dict(os.environ)
        env.update(agent.env)
        self._log = open(log_path, "wb")
        try:
            self.proc = subprocess.Popen(
                agent.argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            self._log.close()
            raise AgentError(f"start {agent.argv[0]}: {e}") from e

    def log_tail(self) -> str:
        """Returns the end of the server's log, for failure reasons."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - LOG_TAIL_BYTES))
                return f.read().decode(errors="replace").strip()
        except OSError as e:
            return f"(log unreadable: {e})"

    def wait_port(self, deadline: float) -> int:
        """Polls until the server reports its port; raises AgentError if it exits or the deadline passes."""
        delay = 0.01
        while True:
            port = self.agent.find_port()
            if port:
                return port
            if self.proc.poll() is not None:
                raise AgentError(f"exited with status {self.proc.returncode} before listening; log: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise AgentError(f"did not report its port within {START_TIMEOUT_S:.0f}s; log: {self.log_tail()}")
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def stop(self) -> None:
        """Sends SIGTERM to the server's process group, SIGKILL after STOP_TIMEOUT_S, then
        kills any descendant left over (pexpect shells run in sessions of their own).
        Idempotent."""
        left = [(p, start_time(p)) for p in descendants(self.proc.pid)] if self.proc.poll() is None else []
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=STOP_TIMEOUT_S)
        for pid, started in left:
            if started is not None and start_time(pid) == started:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self._log.close()


# ---------------------------------------------------------------- measurement


@dataclass
class Plan:
    """What to measure for every agent."""

    calls: int
    warmup: int
    floor_calls: int
    max_seconds: float  # budget of the measured session loop; 0 means none


@dataclass
class Series:
    """The outcome of timed_series."""

    latencies_ms: list[float]  # every call, failed ones included (time until the failure)
    wall_s: float
    cut_by_budget: bool
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)  # the first MAX_ERROR_SAMPLES


MAX_ERROR_SAMPLES = 5


def timed_series(
    n: int,
    budget_s: float,
    call: Callable[[], Any],
    check: Callable[[Any], None],
    max_errors: int = 0,
) -> Series:
    """Runs call up to n times, stopping once budget_s (if > 0) is spent. Only
    call is timed; check validates each answer afterwards.

    A call that raises AgentError, or whose answer check rejects, counts as an
    error; its latency is kept. Raises AgentError once there are more than
    max_errors errors, naming the first and the last.
    """
    out = Series(latencies_ms=[], wall_s=0.0, cut_by_budget=False)
    start = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter_ns()
        err: AgentError | None = None
        try:
            answer = call()
        except AgentError as e:
            err = e
        out.latencies_ms.append((time.perf_counter_ns() - t0) / 1e6)
        if err is None:
            try:
                check(answer)
            except AgentError as e:
                err = e
        if err is not None:
            out.errors += 1
            if len(out.error_samples) < MAX_ERROR_SAMPLES:
                out.error_samples.append(one_line(str(err), 500))
            if out.errors > max_errors:
                first = "" if out.errors == 1 else f"; first: {out.error_samples[0]}"
                raise AgentError(
                    f"call {len(out.latencies_ms)} of {n} failed ({out.errors} failed, {max_errors} tolerated){first}; "
                    f"last: {err}"
                )
        if budget_s > 0 and time.perf_counter() - start >= budget_s:
            break
    out.wall_s = time.perf_counter() - start
    out.cut_by_budget = len(out.latencies_ms) < n
    return out


def tolerated_errors(agent: Agent, calls: int) -> int:
    """Returns how many failed calls a series of agent may have: none for Quarry's
    agent, whose every failure is a bug; for a peer 1% of the calls, at least 10,
    so that one flaky answer (e.g. a pexpect timeout on a busy machine) is
    counted and reported rather than ending its measurement."""
    return 0 if agent.name == "quarry" else max(10, calls // 100)


def measure(agent: Agent, plan: Plan, work: str, log_dir: str) -> dict[str, Any]:
    """Starts agent, measures it and stops it. Returns its result dict.

    Never raises for a failure of the agent: the result then has status
    "not_run" (could not start) or "failed" (started, then answered wrongly)
    and a reason with the error seen.
    """
    result: dict[str, Any] = {"name": agent.name, "version": agent.version, "argv0": agent.argv[0]}
    log_path = os.path.join(log_dir, f"{agent.name}.log")
    result["log"] = log_path
    if not os.access(agent.argv[0], os.X_OK):
        result.update(status="not_run", reason=f"{agent.argv[0]}: not an executable file")
        return result
    try:
        server = Server(agent, log_path, work)
    except AgentError as e:
        result.update(status="not_run", reason=str(e))
        return result
    stage = "start"
    client: Client | None = None
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        port = server.wait_port(deadline)
        client = Client(port, agent.headers)
        health = wait_healthy(client, agent, server, deadline)
        if agent.name == "quarry" and isinstance(health, dict):
            result["version"] = str(health.get("version", ""))

        stage = "create session"
        method, path, body = agent.create_req
        t0 = time.perf_counter()
        sid = agent.session_ref(client.json_call(method, path, body, want=(200, 201)))
        result["session_create_ms"] = round((time.perf_counter() - t0) * 1000, 3)

        run_method, run_path, run_obj = agent.run_req(sid)
        run_body = json.dumps(run_obj).encode()  # encoded once: the timed call only sends it

        def run_call() -> tuple[int, bytes]:
            return client.call(run_method, run_path, run_body)

        def run_check(answer: tuple[int, bytes]) -> None:
            agent.check_run(decode_answer(run_method, run_path, *answer))

        stage = "warm-up"
        warm = timed_series(plan.warmup, 0, run_call, run_check, tolerated_errors(agent, plan.warmup))
        stage = "run"
        runs = timed_series(plan.calls, plan.max_seconds, run_call, run_check, tolerated_errors(agent, plan.calls))
        result["session_run"] = summarize(runs.latencies_ms, runs.wall_s).as_dict()
        result["session_run"].update(
            cut_by_time_budget=runs.cut_by_budget,
            errors=runs.errors,
            warmup_errors=warm.errors,
        )
        if warm.error_samples or runs.error_samples:
            result["session_run"]["error_samples"] = warm.error_samples + runs.error_samples

        stage = "health floor"

        def health_call() -> tuple[int, bytes]:
            return client.call("GET", agent.health_path)

        def health_check(answer: tuple[int, bytes]) -> None:
            agent.check_health(decode_answer("GET", agent.health_path, *answer))

        if plan.floor_calls > 0:
            floor = timed_series(plan.floor_calls, 0, health_call, health_check)
            result["health_floor"] = summarize(floor.latencies_ms, floor.wall_s).as_dict()
            result["health_floor"]["route"] = f"GET {agent.health_path}"

        stage = "close session"
        method, path, body = agent.close_req(sid)
        status, data = client.call(method, path, body)
        if status not in (200, 204):
            raise AgentError(f"{method} {path}: status {status}: {snippet(data)}")
        result["status"] = "ok"
    except AgentError as e:
        status = "not_run" if stage == "start" else "failed"
        if server.proc.poll() is not None and stage != "start":
            e = AgentError(f"{e}; the server exited with status {server.proc.returncode}; log: {server.log_tail()}")
        result.update(status=status, stage=stage, reason=str(e))
    finally:
        if client is not None:
            client.close()
        server.stop()
    if agent.notes:
        result["notes"] = list(agent.notes)
    return result


def wait_healthy(client: Client, agent: Agent, server: Server, deadline: float) -> Any:
    """Polls the agent's health route until it answers 200 with a healthy body.

    Retries only transport errors (not accepting connections yet). Raises
    AgentError when the server exits, the deadline passes, or it answers
    anything but a healthy 200.
    """
    delay = 0.01
    while True:
        try:
            status, data = client.call("GET", agent.health_path)
        except TransportError as e:
            if server.proc.poll() is not None:
                raise AgentError(f"exited with status {server.proc.returncode}; log: {server.log_tail()}") from e
            if time.monotonic() > deadline:
                raise AgentError(f"not healthy within {START_TIMEOUT_S:.0f}s: {e}") from e
        else:
            answer = decode_answer("GET", agent.health_path, status, data)
            agent.check_health(answer)
            return answer
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def peer_versions(venv: str) -> tuple[dict[str, str], str]:
    """Returns the versions of PEER_DISTRIBUTIONS installed in venv, and an error ("" if none)."""
    python = os.path.join(venv, "bin", "python")
    if not os.access(python, os.X_OK):
        return {}, f"{python}: not found (the peers' virtualenv is missing)"
    code = (
        "import importlib.metadata as m, json, sys\n"
        "out = {}\n"
        "for d in sys.argv[1:]:\n"
        "    try: out[d] = m.version(d)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))\n"
    )
    try:
        done = subprocess.run(
            [python, "-c", code, *PEER_DISTRIBUTIONS],
            capture_output=True, timeout=START_TIMEOUT_S, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {}, f"read peer versions: {e}"
    if done.returncode != 0:
        return {}, f"read peer versions: {snippet(done.stderr)}"
    try:
        return json.loads(done.stdout), ""
    except ValueError as e:
        return {}, f"read peer versions: {e}"


# ---------------------------------------------------------------- report


def fmt_ms(v: float) -> str:
    """Formats milliseconds with 3 significant decimals for small values."""
    return f"{v:.3f}" if v < 10 else f"{v:.1f}"


def render_table(report: dict[str, Any]) -> str:
    """Returns the human-readable table of a report."""
    lines = [
        f"Session round trips: `{report['command']}` in one bash session, sequential, "
        f"one keep-alive connection ({report['client']}); {report['plan']['calls']} calls after "
        f"{report['plan']['warmup']} warm-up, at most {report['plan']['max_seconds']:g}s per agent (0 = no limit)",
        "",
        f"{'agent':<9} {'version':<11} {'calls':>6} {'errors':>6} {'p50 ms':>9} {'p99 ms':>9} {'mean ms':>9} "
        f"{'calls/s':>9} {'health p50':>10}  {'p50 vs quarry':<14}",
    ]
    rat = report["ratios"]
    for r in report["agents"]:
        name, version = r["name"], r.get("version") or "?"
        if r["status"] != "ok":
            word = "NOT RUN" if r["status"] == "not_run" else "FAILED"
            lines.append(f"{name:<9} {version:<11} {word}: {one_line(r['reason'])}")
            continue
        s = r["session_run"]
        floor = r.get("health_floor", {}).get("p50_ms")
        if name == "quarry":
            ratio = "1.0× (base)"
        elif name in rat:
            ratio = f"{rat[name]['p50']:.1f}× slower"
        else:
            ratio = "n/a"
        lines.append(
            f"{name:<9} {version:<11} {s['calls']:>6} {s.get('errors', 0):>6} {fmt_ms(s['p50_ms']):>9} {fmt_ms(s['p99_ms']):>9} "
            f"{fmt_ms(s['mean_ms']):>9} {s['rps']:>9.1f} {fmt_ms(floor) if floor is not None else '-':>10}  {ratio:<14}"
        )
    lines.append("")
    for name, v in rat.items():
        verdict = "met" if v["meets_goal"] else "NOT met"
        lines.append(
            f"{name}/quarry: p50 {v['p50']:.1f}×, p99 {v['p99']:.1f}×, mean {v['mean']:.1f}× "
            f"(goal ≥{v['goal']:g}× at p50: {verdict})"
        )
    for r in report["agents"]:
        samples = r.get("session_run", {}).get("error_samples")
        if samples:
            lines.append(f"{r['name']}: failed calls (counted in the latencies), first: {one_line(samples[0], 400)}")
    for r in report["agents"]:
        if r["name"] in PEER_NAMES and r["status"] != "ok":
            lines.append(f"{r['name']}: no ratio, the peer was not measured: {one_line(r['reason'], 400)}")
    return "\n".join(lines)


def one_line(text: str, limit: int = 200) -> str:
    """Collapses whitespace and cuts text to limit characters, for table cells."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


# ---------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parses and validates the command line; exits 2 with a message naming the flag on bad input."""
    p = argparse.ArgumentParser(
        prog="peers.py",
        description="Side-by-side session round trips of Quarry's exec agent and peer agents.",
    )
    p.add_argument("--quarry-agent", required=True, help="path of Quarry's exec agent binary")
    p.add_argument("--venv", default=".cache/peers-venv", help="virtualenv holding swe-rex and rl-rock")
    p.add_argument("--agents", default=",".join(AGENT_NAMES), help="comma-separated subset of: " + ", ".join(AGENT_NAMES))
    p.add_argument("--calls", type=int, default=2000, help="measured session runs per agent")
    p.add_argument("--warmup", type=int, default=20, help="unmeasured session runs before measuring")
    p.add_argument("--floor-calls", type=int, default=500, help="health-route calls per agent (HTTP floor); 0 skips")
    p.add_argument("--max-seconds", type=float, default=120, help="time budget of each agent's measured runs; 0 = none")
    p.add_argument("--json", dest="json_out", default="", help="write the report as JSON to this file")
    p.add_argument("--log-dir", default="", help="keep the agents' logs here (default: a temporary directory)")
    p.add_argument("--setup-error", default="", help="why installing the peers failed; they are reported as not run")
    a = p.parse_args(argv)
    if a.calls < 1 or a.calls > 100_000:
        p.error(f"--calls: must be between 1 and 100000, got {a.calls}")
    if a.warmup < 0 or a.warmup > 10_000:
        p.error(f"--warmup: must be between 0 and 10000, got {a.warmup}")
    if a.floor_calls < 0 or a.floor_calls > 100_000:
        p.error(f"--floor-calls: must be between 0 and 100000, got {a.floor_calls}")
    if a.max_seconds < 0 or a.max_seconds > 3600:
        p.error(f"--max-seconds: must be between 0 and 3600, got {a.max_seconds:g}")
    names = [n.strip() for n in a.agents.split(",") if n.strip()]
    unknown = [n for n in names if n not in AGENT_NAMES]
    if unknown or not names:
        p.error(f"--agents: unknown agent(s) {unknown or names}; choose from {', '.join(AGENT_NAMES)}")
    if "quarry" not in names:
        p.error("--agents: must include quarry (the ratios are relative to it)")
    a.agents = [n for n in AGENT_NAMES if n in names]
    return a


def main(argv: list[str]) -> int:
    """Runs the benchmark; returns 0, or 1 when Quarry's agent could not be measured."""
    args = parse_args(argv)

    def on_term(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)

    with tempfile.TemporaryDirectory(prefix="quarry-peers-") as work:
        log_dir = args.log_dir or os.path.join(work, "logs")
        os.makedirs(log_dir, exist_ok=True)
        venv = os.path.abspath(args.venv)
        plan = Plan(args.calls, args.warmup, args.floor_calls, args.max_seconds)
        versions: dict[str, str] = {}
        setup_error = args.setup_error
        if not setup_error and any(n in PEER_NAMES for n in args.agents):
            versions, setup_error = peer_versions(venv)

        results: list[dict[str, Any]] = []
        for name in args.agents:
            if name == "quarry":
                agent = quarry_agent(os.path.abspath(args.quarry_agent), work)
            elif setup_error:
                results.append({"name": name, "status": "not_run", "reason": f"peer setup: {setup_error}"})
                continue
            elif name == "swe-rex":
                agent = swerex_agent(venv, os.path.join(log_dir, "swe-rex.log"))
                agent.version = versions.get("swe-rex", "")
            else:
                agent = rocklet_agent(venv, os.path.join(log_dir, "rocklet.log"))
                agent.version = versions.get("rl-rock", "")
            print(f"measuring {name} …", file=sys.stderr, flush=True)
            results.append(measure(agent, plan, work, log_dir))

        report = {
            "schema": SCHEMA,
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": COMMAND,
            "client": f"python {platform.python_version()} http.client, TCP_NODELAY",
            "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "system": platform.system()},
            "plan": {
                "calls": plan.calls, "warmup": plan.warmup,
                "floor_calls": plan.floor_calls, "max_seconds": plan.max_seconds,
            },
            "peer_packages": versions,
            "agents": results,
            "ratios": ratios(results),
        }
        print(render_table(report))
        if not args.log_dir:
            # The temporary directory goes away: do not point at logs that will not exist.
            for r in results:
                r.pop("log", None)
        if args.json_out:
            tmp = args.json_out + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(report, f, indent=2)
                f.write("\n")
            os.replace(tmp, args.json_out)
    quarry = next(r for r in results if r["name"] == "quarry")
    if quarry["status"] != "ok":
        print(f"quarry agent: {quarry['reason']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
