"""The one error hierarchy of the service, each class carrying its gRPC status code and the exit
code of the `ptc` command line.

A script that fails or breaks a limit is a *result*, never one of these: these are failures of
a request or of the service itself. The server converts them to gRPC statuses in one place
(`sandbox.server.interceptors`); the client converts statuses back with `from_status`, so a
caller catches the same classes whether it runs embedded or against a server; foreign errors
are translated at each boundary with ``raise ... from``.

    class                        gRPC status          exit  meaning
    PtcError                     INTERNAL              13   a failure of the service itself
    ├── InvalidArgument          INVALID_ARGUMENT       2   bad manifest, script, limits or field
    │   ├── InvalidManifest                                 the manifest did not parse or render
    │   ├── InvalidLimits                                   a limit unknown, malformed, too low
    │   │                                                   or too high
    │   └── MalformedRequest                                the request is not valid protobuf
    ├── NotFound                 NOT_FOUND              8   no such execution for this tenant
    ├── Unauthenticated          UNAUTHENTICATED        9   missing or unknown API key
    ├── PermissionDenied         PERMISSION_DENIED     10   the tenant may not use this backend/mode
    ├── ResourceExhausted        RESOURCE_EXHAUSTED    11   quota, rate or queue full: retry later
    ├── Unavailable              UNAVAILABLE           12   no server there, or no backend to serve
    │   └── StoreUnavailable                                the audit store refuses writes
    ├── Cancelled                CANCELLED              5   the caller went away
    └── FailedPrecondition       FAILED_PRECONDITION   14   the record cannot serve (a replay),
                                                            or the session is busy or was lost

Every message names the field at fault first (``limits.memory_bytes: ...``) and quotes what the
caller sent cut to a bounded length (`quote`); a status carries at most `MAX_STATUS_CHARS`
characters of message (`bounded`), so a hostile input never comes back whole.

"exit" is the exit code of a `ptc` command that ends with the error (`sandbox.cli`); the codes
of a finished execution's status (0 ok, 1 error, 3 limit_exceeded, ...) are `ptc run`'s own.
"""

from __future__ import annotations

import grpc

__all__ = [
    "MAX_QUOTE_CHARS",
    "MAX_STATUS_CHARS",
    "Cancelled",
    "FailedPrecondition",
    "InvalidArgument",
    "InvalidLimits",
    "InvalidManifest",
    "MalformedRequest",
    "NotFound",
    "PermissionDenied",
    "PtcError",
    "ResourceExhausted",
    "StoreUnavailable",
    "Unauthenticated",
    "Unavailable",
    "bounded",
    "from_status",
    "quote",
]

MAX_QUOTE_CHARS = 64
MAX_STATUS_CHARS = 2048


def quote(value: object, limit: int = MAX_QUOTE_CHARS) -> str:
    """``repr(value)`` for a message, a string cut to its first ``limit`` characters with the
    number of characters left out (``'aaaa'... (99996 more characters)``)."""
    if isinstance(value, str | bytes) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value) - limit} more characters)"
    return repr(value)[: limit + 2]


def bounded(message: str, limit: int = MAX_STATUS_CHARS) -> str:
    """``message`` cut to ``limit`` characters, saying how many were left out: what a status
    carries (a long one would exceed the client's metadata limit and hide the error)."""
    if len(message) <= limit:
        return message
    return f"{message[:limit]}... ({len(message) - limit} more characters)"


class PtcError(Exception):
    """Base of every error the service raises on purpose."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    exit_code: int = 13
    label: str = "internal error"  # how the command line names the class

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(PtcError):
    code = grpc.StatusCode.INVALID_ARGUMENT
    exit_code = 2
    label = "invalid argument"


class InvalidManifest(InvalidArgument):
    """The manifest is not JSON, has an unknown dialect, bad names or an invalid schema."""


class InvalidLimits(InvalidArgument):
    """A limit is unknown, malformed, or above the ceiling with a refuse policy."""


class MalformedRequest(InvalidArgument):
    """The request's bytes are not a valid protobuf message of its type (truncated, a string
    that is not UTF-8, ...): the message names the field where decoding failed."""


class NotFound(PtcError):
    code = grpc.StatusCode.NOT_FOUND
    exit_code = 8
    label = "not found"


class ResourceExhausted(PtcError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    exit_code = 11
    label = "resource exhausted"

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unauthenticated(PtcError):
    code = grpc.StatusCode.UNAUTHENTICATED
    exit_code = 9
    label = "unauthenticated"


class PermissionDenied(PtcError):
    code = grpc.StatusCode.PERMISSION_DENIED
    exit_code = 10
    label = "permission denied"


class Unavailable(PtcError):
    code = grpc.StatusCode.UNAVAILABLE
    exit_code = 12
    label = "unavailable"


class Cancelled(PtcError):
    code = grpc.StatusCode.CANCELLED
    exit_code = 5
    label = "cancelled"


class FailedPrecondition(PtcError):
    """The request is valid but what it names cannot serve it: a record that predates replay
    support or has no result to answer tool calls from; a session running another execution,
    or one whose sandbox was lost."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    exit_code = 14
    label = "failed precondition"


_BY_CODE: dict[grpc.StatusCode, type[PtcError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        ResourceExhausted,
        Unauthenticated,
        PermissionDenied,
        Unavailable,
        Cancelled,
        FailedPrecondition,
    )
}


def from_status(
    code: grpc.StatusCode, message: str, retry_after_s: float | None = None
) -> PtcError:
    """The error of this hierarchy for a gRPC status (the client's side of the interceptor).

    Codes the hierarchy does not declare (a deadline the caller set, an internal error) give a
    `PtcError` whose ``code`` is the status received."""
    cls = _BY_CODE.get(code)
    if cls is ResourceExhausted:
        return ResourceExhausted(message, retry_after_s)
    if cls is not None:
        return cls(message)
    error = PtcError(f"{code.name}: {message}" if message else code.name)
    error.code = code
    return error


class StoreUnavailable(Unavailable):
    """The audit store refused a write or could not be reached (a full disk, a read-only file
    or database, PostgreSQL down): UNAVAILABLE, with the store's own error in the message. The
    server leaves the rotation (readiness NOT_SERVING) until a write succeeds again."""
