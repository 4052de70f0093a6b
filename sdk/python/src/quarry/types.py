"""The values the gateway answers, as dataclasses. Each keeps the whole JSON
object in ``raw``: fields a newer gateway adds are there before this SDK names
them. A field whose JSON name is a Python keyword ends in ``_`` (``class_``)."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from .errors import QuarryError

__all__ = [
    "SandboxInfo", "Pool", "ExecResult", "ExecEvent", "SessionInfo", "RunResult",
    "ProcessInfo", "ProcessOutput", "FileInfo", "WriteResult", "Checkpoint",
    "RestoreResult", "Exchange", "KillAllResult", "EnvInfo", "Class", "Image", "ImagePage",
    "PrefetchedImage", "BuildResult", "parse_time",
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
    """cls from a JSON object: known fields (times parsed: those named ``*_at``
    and those typed datetime), the rest in raw. A field ``class_`` reads
    ``class``."""
    d = d if isinstance(d, dict) else {}
    kw: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name == "raw":
            continue
        key = f.name[:-1] if f.name.endswith("_") else f.name
        if key in d and d[key] is not None:
            v = d[key]
            if f.name.endswith("_at") or f.name in ("deadline",) or "datetime" in str(f.type):
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
    """A configured warm pool and its counts (GET /v1/pools). memory_mib and
    disk_mib are MiB (disk_mib 0: the provider's default)."""

    name: str = ""
    provider: str = ""
    image: str = ""
    cpu: float = 0.0
    memory_mib: int = 0
    disk_mib: int = 0
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


@dataclass
class Class:
    """A pool class of on-demand pools (GET /v1/pools, ``classes``): the
    provider, the images it serves (patterns), the sizes a create gets when
    it names none and the most it may ask for (MiB), its bounds and how many
    tasks its pools have now."""

    name: str = ""
    provider: str = ""
    images: list[str] = field(default_factory=list)
    cpu: float = 0.0
    memory_mib: int = 0
    disk_mib: int = 0
    max_cpu: float = 0.0
    max_memory_mib: int = 0
    max_disk_mib: int = 0
    max_total: int = 0
    max_per_image: int = 0
    tasks: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Image:
    """An image of an on-demand pool, or one a provider is preparing or
    failed to prepare (GET /v1/images). ``image`` is its normalized reference
    (``docker.io/library/python:3.11``); ``pool`` is empty while no pool
    holds it (its first preparation). ``state`` is ``pulling`` (with
    ``bytes_done`` and ``bytes_total`` when the provider reports them),
    ``ready`` or ``failed`` (with ``reason``); :meth:`Images.wait
    <quarry.Images.wait>` also reports ``queued``, an image not listed yet.
    ``pool_state`` is ``active`` or ``ended`` (empty without a pool)."""

    image: str = ""
    class_: str = ""
    pool: str = ""
    cpu: float = 0.0
    memory_mib: int = 0
    disk_mib: int = 0
    pool_state: str = ""
    state: str = ""
    reason: str = ""
    bytes_done: int = 0
    bytes_total: int = 0
    size_bytes: int = 0
    digest: str = ""
    created_at: _dt.datetime | None = None
    last_used: _dt.datetime | None = None
    acquires: int = 0
    warm: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ready(self) -> bool:
        """Its pool is active and the provider has its image."""
        return self.state == "ready" and self.pool_state in ("", "active") and bool(self.pool)

    @property
    def failed(self) -> bool:
        return self.state == "failed"

    @property
    def progress(self) -> float | None:
        """The fraction pulled (0..1) while pulling, when the provider reports sizes."""
        if self.state == "ready":
            return 1.0
        if self.bytes_total <= 0:
            return None
        return min(1.0, self.bytes_done / self.bytes_total)


@dataclass
class ImagePage:
    """One page of GET /v1/images; ``next`` is the cursor of the next page,
    None after the last."""

    images: list[Image] = field(default_factory=list)
    next: str | None = None


@dataclass
class PrefetchedImage:
    """One image of a prefetch's answer, in the order asked. ``ref`` is its
    normalized reference (as :class:`Image` names it) and ``pool`` its
    on-demand pool; ``state`` is ``queued`` (its preparation runs in the
    background), ``ready`` (its pool is there) or ``refused``, with ``error``
    the exception a create of it would raise (:class:`~quarry.errors.ImageNotAllowed`,
    :class:`~quarry.errors.BadRequest`, ...)."""

    image: str = ""
    ref: str = ""
    pool: str = ""
    state: str = ""
    error: QuarryError | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def refused(self) -> bool:
        return self.state == "refused"


@dataclass
class BuildResult:
    """An image built (POST /v1/images/build): ``image`` is the reference a
    create may name at once."""

    image: str = ""
    digest: str = ""
    size_bytes: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
