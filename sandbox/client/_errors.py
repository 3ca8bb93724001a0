"""gRPC failures back into `sandbox.errors` classes, at the client's one boundary with grpc.

The server raises `sandbox.errors` classes and its interceptor turns them into statuses; the
client turns the statuses back, so that ``except Unavailable`` or ``except PermissionDenied``
works the same against a server as embedded. The server's message is kept as it was sent; a
`ResourceExhausted` gets the server's retry-after hint back from the trailing metadata. A call
that gRPC ended because the server stopped answering the client's keepalive pings (given the
client's `Keepalive`) raises `Unavailable` saying so and within how long, not gRPC's bare words.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc

from sandbox.errors import PtcError, Unavailable, from_status
from sandbox.keepalive import Keepalive, is_keepalive_failure

__all__ = ["error_from_rpc", "error_from_status", "translated"]


def error_from_rpc(exc: grpc.RpcError, keepalive: Keepalive | None = None) -> PtcError:
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return error_from_status(code, details, trailing, keepalive)


def error_from_status(
    code: grpc.StatusCode,
    details: str | None,
    trailing: Iterable[Any] | None,
    keepalive: Keepalive | None = None,
) -> PtcError:
    if (
        code == grpc.StatusCode.UNAVAILABLE
        and keepalive is not None
        and keepalive.enabled
        and is_keepalive_failure(details)
    ):
        return Unavailable(keepalive.message(details or ""))
    retry_after: float | None = None
    for key, value in trailing or ():
        if key == "retry-after":
            with contextlib.suppress(TypeError, ValueError):
                retry_after = float(value)
    return from_status(code, details or "", retry_after)


@contextlib.asynccontextmanager
async def translated(keepalive: Keepalive | None = None) -> AsyncIterator[None]:
    """Raises the `sandbox.errors` class of any gRPC failure inside the block."""
    try:
        yield
    except grpc.RpcError as exc:
        raise error_from_rpc(exc, keepalive) from exc
