"""The one error hierarchy of the service, each class carrying its gRPC status code.

A script that fails or breaks a limit is a *result*, never one of these: these are failures of
a request or of the service itself. The server converts them to gRPC statuses in one place
(`sandbox.server.interceptors`); foreign errors are translated at each boundary with
``raise ... from``.

    PtcError (INTERNAL)
    ├── InvalidArgument (INVALID_ARGUMENT)   bad manifest, script, limits or RPC field
    │   ├── InvalidManifest                  the manifest did not parse or render
    │   └── InvalidLimits                    a limit is unknown, malformed or above a ceiling
    ├── NotFound (NOT_FOUND)                 no such execution for this tenant
    ├── ResourceExhausted (RESOURCE_EXHAUSTED) quota, rate or queue full
    ├── Unauthenticated (UNAUTHENTICATED)    missing or unknown API key
    ├── PermissionDenied (PERMISSION_DENIED) the tenant may not use this backend or mode
    ├── Unavailable (UNAVAILABLE)            a backend or the pool cannot serve
    └── Cancelled (CANCELLED)                the caller went away
"""

from __future__ import annotations

import grpc

__all__ = [
    "Cancelled",
    "InvalidArgument",
    "InvalidLimits",
    "InvalidManifest",
    "NotFound",
    "PermissionDenied",
    "PtcError",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
]


class PtcError(Exception):
    """Base of every error the service raises on purpose."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(PtcError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class InvalidManifest(InvalidArgument):
    """The manifest is not JSON, has an unknown dialect, bad names or an invalid schema."""


class InvalidLimits(InvalidArgument):
    """A limit is unknown, malformed, or above the ceiling with a refuse policy."""


class NotFound(PtcError):
    code = grpc.StatusCode.NOT_FOUND


class ResourceExhausted(PtcError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unauthenticated(PtcError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(PtcError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unavailable(PtcError):
    code = grpc.StatusCode.UNAVAILABLE


class Cancelled(PtcError):
    code = grpc.StatusCode.CANCELLED
