"""The one place where `sandbox.errors.PtcError` becomes a gRPC status.

Every method of the sandbox service is wrapped: a `PtcError` is sent as its class's status code
with its message (which, for INVALID_ARGUMENT, starts with the field at fault); a
`ResourceExhausted` also carries its retry-after hint as trailing metadata (``retry-after``, in
seconds, as HTTP does). Any other exception is a bug: it is logged with its traceback and the
client sees INTERNAL without internals. Cancellation passes through untouched.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from sandbox.errors import PtcError, ResourceExhausted

__all__ = ["ErrorInterceptor", "abort_for"]

log = logging.getLogger(__name__)
SERVICE_PREFIX = "/ptc.sandbox.v1.SandboxService/"


async def abort_for(exc: BaseException, context: aio.ServicerContext[Any, Any]) -> None:
    """Ends the RPC with the status ``exc`` stands for; always raises."""
    if isinstance(exc, PtcError):
        metadata: tuple[tuple[str, str], ...] = ()
        if isinstance(exc, ResourceExhausted) and exc.retry_after_s is not None:
            metadata = (("retry-after", f"{exc.retry_after_s:g}"),)
        await context.abort(exc.code, exc.message, trailing_metadata=metadata)
    log.error("internal error in an RPC", exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the server log")


def _is_abort(exc: BaseException) -> bool:
    # context.abort raises grpc's own AbortError, which must pass through as is.
    return type(exc).__name__ == "AbortError" or isinstance(exc, grpc.RpcError)


def _wrap_unary(behaviour: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def wrapped(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await behaviour(request, context)
        except Exception as exc:
            if _is_abort(exc):
                raise
            await abort_for(exc, context)

    return wrapped


def _wrap_stream(behaviour: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    async def wrapped(request: Any, context: aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        try:
            async for item in behaviour(request, context):
                yield item
        except Exception as exc:
            if _is_abort(exc):
                raise
            await abort_for(exc, context)

    return wrapped


class ErrorInterceptor(aio.ServerInterceptor):  # type: ignore[type-arg]
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler: Any = await continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(SERVICE_PREFIX):
            return handler
        common = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(_wrap_unary(handler.unary_unary), **common)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(_wrap_unary(handler.stream_unary), **common)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(handler.unary_stream), **common
            )
        behaviour = handler.stream_stream
        # A handler that reads and writes through its context is a coroutine, not a generator.
        wrap = _wrap_stream if inspect.isasyncgenfunction(behaviour) else _wrap_unary
        return grpc.stream_stream_rpc_method_handler(wrap(behaviour), **common)
