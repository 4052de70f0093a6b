"""The values the gateway answers, as dataclasses. Each keeps the whole JSON
object in ``raw``: fields a newer gateway adds are there before this SDK names
them."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

__all__ = [
    "SandboxInfo", "Pool", "ExecResult", "ExecEvent", "SessionInfo", "RunResult",
    "ProcessInfo", "ProcessOutput", "FileInfo", "WriteResult", "Checkpoint",
    "RestoreResult", "Exchange", "KillAllResult", "EnvInfo", "parse_time",
]

T = TypeVar("T")


def parse_time(v: Any) -> _dt.datetime | None:
    """An RFC 3339 time of the gateway, or None."""
    if not isinstance(v, str) or not v or v.startswith("0001-01-01"):
        return None
    s = v.replace("Z", "+00:00")
    # Go writes up to nine fractional digits; Python's fromisoformat takes six (3.10).
    if "." in s:
        head, _, rest = s.partition(".")
        digits = "".join(c for c in rest if c.isdigit())
        tz = rest[len(digits):]
        s = f"{head}.{digits[:6].ljust(6, '0')}{tz}"
    try:
        return _dt.datetime.fromisoformat(s)
    except ValueError:
        return None


def build(cls: type[T], d: Any) -> T:
    """cls from a JSON object: known fields (times parsed), the rest in raw."""
    d = d if isinstance(d, dict) else {}
    kw: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name == "raw":
            continue
        if f.name in d and d[f.name] is not None:
            v = d[f.name]
            if f.name.endswith("_at") or f.name in ("deadline",):
                v = parse_time(v)
            kw[f.name] = v
    return cls(raw=d, **kw)  # type: ignore[call-arg]


@dataclass
class SandboxInfo:
    """A lease as the gateway answers it (docs/API.md "Sandboxes")."""

    id: str = ""
    pool: str = ""
    state: str = ""
    reason: str = ""
    generation: int = 0
    created_at: _dt.datetime | None = None
    expires_at: _dt.datetime | None = None
    ended_at: _dt.datetime | None = None
    lease_seconds: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Pool:
    name: str = ""
    provider: str = ""
    image: str = ""
    min_warm: int = 0
    max_total: int = 0
    default_lease_seconds: int = 0
    max_lease_seconds: int = 0
    ready: int = 0
    launching: int = 0
    leased: int = 0
    stopping: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class ExecResult:
    """A command's result. ``stdout``/``stderr`` are text, or bytes when the
    exec asked for ``binary=True``."""

    exit_code: int = 0
    signal: str = ""
    stdout: Any = ""
    stderr: Any = ""
    duration_ms: int = 0
    timed_out: bool = False
    truncated: bool = False
    oom_killed: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class ExecEvent:
    """One event of exec_stream: ``type`` is ``stdout`` or ``stderr`` (with
    ``data``), or ``exit`` (with ``result``, the last event)."""

    type: str
    data: Any = ""
    result: ExecResult | None = None


@dataclass
class SessionInfo:
    id: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class RunResult:
    """A session run's result."""

    exit_code: int = 0
    output: str = ""
    duration_ms: int = 0
    timed_out: bool = False
    truncated: bool = False
    closed: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class ProcessInfo:
    id: str = ""
    name: str = ""
    pid: int = 0
    command: str = ""
    state: str = ""
    exit_code: int | None = None
    signal: str = ""
    started_at: _dt.datetime | None = None
    ended_at: _dt.datetime | None = None
    output_bytes: int = 0
    oom_killed: bool = False
    group_running: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def running(self) -> bool:
        return self.state == "running"


@dataclass
class ProcessOutput:
    offset: int = 0
    next_offset: int = 0
    data: str = ""
    dropped: int = 0
    state: str = ""
    exit_code: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class FileInfo:
    name: str = ""
    path: str = ""
    size: int = 0
    mode: str = ""
    is_dir: bool = False
    symlink: str = ""
    mod_time: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class WriteResult:
    path: str = ""
    bytes: int = 0
    entries: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Checkpoint:
    """A stored checkpoint (docs/API.md "Checkpoints")."""

    id: str = ""
    pool: str = ""
    image: str = ""
    sandbox: str = ""
    paths: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    format: str = ""
    size_bytes: int = 0
    files: int = 0
    sha256: str = ""
    created_at: _dt.datetime | None = None
    expires_at: _dt.datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class RestoreResult:
    sandbox_id: str = ""
    checkpoint: str = ""
    files: int = 0
    bytes: int = 0
    duration_ms: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Exchange:
    """One request/response pair of a lease's model transcript."""

    id: str = ""
    state: str = ""
    reason: str = ""
    route: str = ""
    stream: bool = False
    attempt: int = 0
    request: Any = None
    response: Any = None
    received_at: _dt.datetime | None = None
    claimed_at: _dt.datetime | None = None
    ended_at: _dt.datetime | None = None
    latency_ms: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class KillAllResult:
    killed: int = 0
    threads: int = 0
    left: int = 0
    duration_ms: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class EnvInfo:
    id: str = ""
    pool: str = ""
    step_timeout_ms: int = 0
    reset_timeout_ms: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
