"""Quarry's Python SDK (package quarry-sandbox).

    async with AsyncQuarry() as q:                      # $QUARRY_URL, $QUARRY_API_KEY
        async with q.sandboxes.create(pool="default") as sb:
            r = await sb.exec("echo hi")

:class:`Quarry` is the same API, sync. Errors are :mod:`quarry.errors`.
"""

from . import errors
from ._client import AsyncQuarry, Checkpoints
from ._envs import Env, Envs
from ._images import Images
from ._model import Model, ModelCall
from ._sandbox import Files, ForkResult, Process, Sandbox, SandboxModel, Sandboxes, Session
from ._sync import Quarry, SyncProxy
from .errors import (
    AgentUnreachable, BadRequest, BuildFailed, Busy, CheckpointCorrupt, CommandFailed, Conflict,
    EnvError, EnvTimeout, EpisodeNotRunning, Forbidden, Gone, ImageDenied, ImageFailed, ImageNotAllowed,
    ImageNotFound, InsufficientStorage, Internal, InvalidAction, MethodNotAllowed, NameInUse, NoCapacity,
    NoReply, NotFound, PayloadTooLarge, PidsLimit, PortClosed, ProcessExited, ProtocolError, QuarryError,
    QuotaExceeded, RegistryUnavailable, Timeout, Unauthorized, Unavailable, UpstreamUnreachable,
)
from .types import (
    BuildResult, Checkpoint, Class, EnvInfo, Exchange, ExecEvent, ExecResult, FileInfo, Image,
    ImagePage, KillAllResult, Pool, PrefetchedImage, ProcessInfo, ProcessOutput, RestoreResult,
    RunResult, SandboxInfo, SessionInfo, WriteResult,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncQuarry", "Quarry", "SyncProxy", "Sandbox", "Sandboxes", "Session", "Process", "Files",
    "SandboxModel", "ForkResult", "Checkpoints", "Model", "ModelCall", "Env", "Envs", "Images", "errors",
    "QuarryError", "BadRequest", "InvalidAction", "Unauthorized", "Forbidden", "NotFound",
    "MethodNotAllowed", "Conflict", "Busy", "NameInUse", "ProcessExited", "NoReply", "ProtocolError",
    "EpisodeNotRunning", "Gone", "PayloadTooLarge", "CommandFailed", "QuotaExceeded", "Internal",
    "CheckpointCorrupt", "AgentUnreachable", "UpstreamUnreachable", "PortClosed", "EnvError", "Unavailable",
    "NoCapacity", "PidsLimit", "Timeout", "EnvTimeout", "InsufficientStorage", "ImageNotAllowed",
    "ImageDenied", "ImageNotFound", "RegistryUnavailable", "BuildFailed", "ImageFailed", "Checkpoint",
    "EnvInfo", "Exchange", "ExecEvent", "ExecResult",
    "FileInfo", "KillAllResult", "Pool", "ProcessInfo", "ProcessOutput", "RestoreResult", "RunResult",
    "SandboxInfo", "SessionInfo", "WriteResult", "Class", "Image", "ImagePage", "PrefetchedImage",
    "BuildResult", "__version__",
]
