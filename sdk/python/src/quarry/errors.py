"""Quarry's errors: one exception class per error code of the gateway.

Every error the gateway answers has one shape, ``{"error": {"code", "message"}}``
(docs/API.md). :func:`from_response` turns it into the class of its code; a code
this SDK does not know falls back to the class of its HTTP status, and then to
:class:`QuarryError`. Streams (exec_stream, follow) end with an ``error`` event
of the same shape, raised the same way with ``status`` 0.
"""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any

__all__ = [
    "QuarryError",
    "BadRequest",
    "Unauthorized",
    "Forbidden",
    "ImageNotAllowed",
    "ImageDenied",
    "NotFound",
    "ImageNotFound",
    "MethodNotAllowed",
    "Conflict",
    "Busy",
    "NameInUse",
    "ProcessExited",
    "NoReply",
    "ProtocolError",
    "EpisodeNotRunning",
    "Gone",
    "PayloadTooLarge",
    "CommandFailed",
    "BuildFailed",
    "ImageFailed",
    "QuotaExceeded",
    "InvalidAction",
    "Internal",
    "CheckpointCorrupt",
    "AgentUnreachable",
    "UpstreamUnreachable",
    "PortClosed",
    "EnvError",
    "Unavailable",
    "NoCapacity",
    "PidsLimit",
    "RegistryUnavailable",
    "Timeout",
    "EnvTimeout",
    "InsufficientStorage",
    "from_response",
    "from_body",
]


class QuarryError(Exception):
    """An error answer of the gateway (or an ``error`` event of a stream).

    ``status`` is the HTTP status (0 for a stream's error event), ``code`` the
    gateway's machine-readable code, ``message`` its text for people.
    """

    code: str = ""
    status_default: int = 0

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        code: str | None = None,
        retry_after: float | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        if code is not None:
            self.code = code
        self.retry_after = retry_after
        self.request_id = request_id

    def __str__(self) -> str:
        where = f"{self.status} {self.code}" if self.status else self.code
        return f"{self.message} ({where})"


class BadRequest(QuarryError):
    """400: malformed input. ``field`` is the field the message names
    (``lease_seconds`` for "lease_seconds: must be between 1 and 86400"), or
    None when it names none."""

    code = "bad_request"
    status_default = 400

    @property
    def field(self) -> str | None:
        head, sep, _ = self.message.partition(":")
        if not sep or not head or " " in head.strip():
            return None
        return head.strip()


class InvalidAction(BadRequest):
    """400 ``invalid_action``: the env refused the action (or reset options)."""

    code = "invalid_action"


class Unauthorized(QuarryError):
    """401: a missing or wrong API key (or relay token)."""

    code = "unauthorized"
    status_default = 401


class Forbidden(QuarryError):
    """403: the sandbox refused the operation (a path its user may not read or
    write), or the gateway did (an image build this key may not run: the
    message names the key's owner id)."""

    code = "forbidden"
    status_default = 403


class ImageNotAllowed(Forbidden):
    """403 ``image_not_allowed``: the operator does not let this key (or the
    class) ask for the image; the message names the rules that refused it."""

    code = "image_not_allowed"


class ImageDenied(Forbidden):
    """403 ``image_denied``: the image's registry refused the gateway's
    credentials for it; the message names the image, the registry and its answer."""

    code = "image_denied"


class NotFound(QuarryError):
    """404: unknown sandbox (or another key's), session, process, file, checkpoint,
    model request or route."""

    code = "not_found"
    status_default = 404


class ImageNotFound(NotFound):
    """404 ``image_not_found``: the image does not exist in its registry; the
    message names the image, the registry and its answer."""

    code = "image_not_found"


class MethodNotAllowed(QuarryError):
    """405: a known path with another method."""

    code = "method_not_allowed"
    status_default = 405


class Conflict(QuarryError):
    """409: a concurrent change, a limit of the agent, a request answered twice."""

    code = "conflict"
    status_default = 409


class Busy(Conflict):
    """409 ``busy``: the session (or process, or sandbox during a restore) is
    running something else."""

    code = "busy"


class NameInUse(Conflict):
    """409 ``name_in_use``: a running process already has that name."""

    code = "name_in_use"


class ProcessExited(Conflict):
    """409 ``process_exited``: the rpc process has exited."""

    code = "process_exited"


class NoReply(Conflict):
    """409 ``no_reply``: the rpc process closed stdout without a reply."""

    code = "no_reply"


class ProtocolError(Conflict):
    """409 ``protocol_error``: the rpc process's reply was not one JSON line (it was killed)."""

    code = "protocol_error"


class EpisodeNotRunning(Conflict):
    """409 ``episode_not_running``: a step before reset, after the end or after a crash."""

    code = "episode_not_running"


class Gone(QuarryError):
    """410: the sandbox's lease has ended (released, expired or lost).

    ``state``, ``ended_at`` and ``reason`` say how, when the SDK could read the
    sandbox after the error (a call made through a :class:`~quarry.Sandbox`);
    otherwise only ``message`` says it."""

    code = "gone"
    status_default = 410

    def __init__(self, message: str, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.sandbox_id: str | None = None
        self.state: str | None = None
        self.ended_at: _dt.datetime | None = None
        self.reason: str | None = None


class PayloadTooLarge(QuarryError):
    """413: a body, a file or a checkpoint over its limit."""

    code = "payload_too_large"
    status_default = 413


class CommandFailed(QuarryError):
    """422: a command failed where the caller asked for failure to be an error."""

    code = "command_failed"
    status_default = 422


class BuildFailed(QuarryError):
    """422 ``build_failed``: an image build ran and failed (a step, a bad
    Dockerfile); the message is the build's. A build's log came to its
    ``on_log`` before."""

    code = "build_failed"
    status_default = 422


class ImageFailed(QuarryError):
    """An image's preparation failed (a pull, a task definition), as GET
    /v1/images reports it: raised by :meth:`Images.wait <quarry.Images.wait>`,
    never answered by a call (``status`` 0). ``image`` is its reference,
    ``reason`` the provider's."""

    code = "image_failed"

    def __init__(self, message: str, *, image: str = "", reason: str = "", **kw: Any) -> None:
        super().__init__(message, **kw)
        self.image = image
        self.reason = reason


class QuotaExceeded(QuarryError):
    """429 ``quota_exceeded``: a budget of the caller's is spent (the checkpoint
    store's, per API key or in all); nothing was kept. Not retryable: the message
    names the limit, what it counts and the variable that sets it; delete some
    checkpoints first."""

    code = "quota_exceeded"
    status_default = 429


class Internal(QuarryError):
    """500: a bug, or a pool that cannot launch (the message says why)."""

    code = "internal"
    status_default = 500


class CheckpointCorrupt(Internal):
    """500 ``checkpoint_corrupt``: the stored archive does not match its sha256; nothing was restored."""

    code = "checkpoint_corrupt"


class AgentUnreachable(QuarryError):
    """502: the sandbox's agent did not answer."""

    code = "agent_unreachable"
    status_default = 502


class UpstreamUnreachable(AgentUnreachable):
    """502 ``upstream_unreachable``: a model relay passthrough upstream failed."""

    code = "upstream_unreachable"


class PortClosed(AgentUnreachable):
    """502 ``port_closed``: nothing listens on the sandbox port a proxied call
    (``/v1/sandboxes/{id}/ports/{port}/...``, a preview URL) named; the agent is
    fine, and the message names the port."""

    code = "port_closed"


class EnvError(AgentUnreachable):
    """502 ``env_error``: the env program crashed or answered something malformed."""

    code = "env_error"


class Unavailable(QuarryError):
    """503: the lease store, the relay or the checkpoint store is unavailable; the
    operation did not happen. ``retry_after`` is the server's Retry-After in
    seconds (None without one)."""

    code = "unavailable"
    status_default = 503


class NoCapacity(Unavailable):
    """503 ``no_capacity``: the pool is at its max_total. ``retry_after`` as for
    :class:`Unavailable`."""

    code = "no_capacity"


class PidsLimit(Unavailable):
    """503 ``pids_limit``: the sandbox is at its pids limit, so nothing could start;
    retry once some of its processes exit, or kill them all (``kill_all``).
    ``retry_after`` as for :class:`Unavailable`."""

    code = "pids_limit"


class RegistryUnavailable(Unavailable):
    """503 ``registry_unavailable``: the image's registry did not answer;
    nothing was made. Retryable: ``retry_after`` as for :class:`Unavailable`
    (``sandboxes.create`` retries it)."""

    code = "registry_unavailable"


class Timeout(QuarryError):
    """504: the agent (or the trainer, for a relay call) did not answer in time."""

    code = "timeout"
    status_default = 504


class EnvTimeout(Timeout):
    """504 ``env_timeout``: the env program did not answer within its step or reset timeout."""

    code = "env_timeout"


class InsufficientStorage(QuarryError):
    """507: the sandbox's disk is full."""

    code = "insufficient_storage"
    status_default = 507


# Every code the gateway answers (ImageFailed is the SDK's own: no answer has it).
_BY_CODE: dict[str, type[QuarryError]] = {
    c.code: c
    for c in (
        BadRequest, InvalidAction, Unauthorized, Forbidden, ImageNotAllowed, ImageDenied, NotFound,
        ImageNotFound, MethodNotAllowed, Conflict, Busy, NameInUse, ProcessExited, NoReply, ProtocolError,
        EpisodeNotRunning, Gone, PayloadTooLarge, CommandFailed, BuildFailed, QuotaExceeded, Internal,
        CheckpointCorrupt, AgentUnreachable, UpstreamUnreachable, PortClosed, EnvError, Unavailable,
        NoCapacity, PidsLimit, RegistryUnavailable, Timeout, EnvTimeout, InsufficientStorage,
    )
}
# The agent's own name for a newer lease; the gateway answers it as gone.
_BY_CODE["stale_generation"] = Gone

_BY_STATUS: dict[int, type[QuarryError]] = {
    c.status_default: c
    for c in (
        BadRequest, Unauthorized, Forbidden, NotFound, MethodNotAllowed, Conflict, Gone,
        PayloadTooLarge, CommandFailed, QuotaExceeded, Internal, AgentUnreachable, Unavailable, Timeout,
        InsufficientStorage,
    )
}


def class_for(code: str, status: int) -> type[QuarryError]:
    """The exception class of an error code (falling back to its status)."""
    return _BY_CODE.get(code) or _BY_STATUS.get(status) or QuarryError


def make(code: str, message: str, status: int = 0, retry_after: float | None = None,
         request_id: str | None = None) -> QuarryError:
    """An exception of the class of code, with the gateway's message."""
    cls = class_for(code, status)
    return cls(message, status=status, code=code or None, retry_after=retry_after, request_id=request_id)


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        n = float(value.strip())
    except ValueError:
        return None
    return n if n >= 0 else None


def from_body(status: int, body: bytes, headers: Any = None) -> QuarryError:
    """The exception of an error answer: status, body and (optional) headers."""
    get = (lambda k: headers.get(k)) if headers is not None else (lambda k: None)
    retry_after = _retry_after(get("retry-after"))
    request_id = get("x-quarry-request-id")
    code, message = "", ""
    try:
        doc = json.loads(body)
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            code = str(doc["error"].get("code") or "")
            message = str(doc["error"].get("message") or "")
    except ValueError:
        pass
    if not code:
        message = " ".join(body[:512].decode("utf-8", "replace").split()) or f"HTTP {status}"
    return make(code, message or code, status, retry_after, request_id)


def from_response(response: Any) -> QuarryError:
    """The exception of an httpx response whose status is not 2xx (its body read)."""
    return from_body(response.status_code, response.content, response.headers)
