"""The one place where `sandbox.errors.PtcError` becomes a gRPC status.

Every method of the sandbox service is wrapped: a `PtcError` is sent as its class's status code
with its message (which, for INVALID_ARGUMENT, starts with the field at fault), cut to
`sandbox.errors.MAX_STATUS_CHARS`; a `ResourceExhausted` also carries its retry-after hint as
trailing metadata (``retry-after``, in seconds, as HTTP does). A client's mistake is never
logged with a traceback: a request that is not valid protobuf gets one rate-limited WARNING line
naming its peer (`boundary.ClientMistakes`), the others none. Any other exception is a bug: it
is logged with its traceback and the client sees INTERNAL without internals. Cancellation
passes through untouched.

Each method is registered with `boundary.tolerant_decoder` of its request type instead of
gRPC's, so that undecodable bytes reach the wrapper (which raises `MalformedRequest`) rather
than failing inside gRPC as UNKNOWN. With a tenancy, a unary call's credential is checked from
its metadata before its request is read (`boundary.authenticate`). A call that says it was carried
from another server (`peers.FORWARDED_BY`) must come over a fleet server's connection
(`peers.FleetIdentity`), or it is refused with UNAUTHENTICATED before its method runs.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import message_factory
from grpc import aio

from sandbox._proto import sandbox_pb2 as pb
from sandbox.errors import MalformedRequest, PtcError, ResourceExhausted, bounded
from sandbox.server.boundary import ClientMistakes, authenticate, checked, tolerant_decoder
from sandbox.server.peers import FORWARDED_BY, HOLDER_ANSWER, FleetIdentity
from sandbox.tenants.base import Tenancy

__all__ = ["ErrorInterceptor", "abort_for"]

log = logging.getLogger(__name__)
SERVICE_PREFIX = "/ptc.sandbox.v1.SandboxService/"
_REQUEST_TYPES = {
    method.name: message_factory.GetMessageClass(method.input_type)
    for method in pb.DESCRIPTOR.services_by_name["SandboxService"].methods
}
_MISTAKES = ClientMistakes()


async def abort_for(
    exc: BaseException, context: aio.ServicerContext[Any, Any], method: str = ""
) -> None:
    """Ends the RPC with the status ``exc`` stands for; always raises."""
    # An error answered to a carried call says so, for the forwarder to pass it on unchanged.
    metadata: tuple[tuple[str, str], ...] = ()
    if any(key == FORWARDED_BY for key, _ in context.invocation_metadata() or ()):
        metadata = ((HOLDER_ANSWER, "1"),)
    if isinstance(exc, PtcError):
        if isinstance(exc, ResourceExhausted) and exc.retry_after_s is not None:
            metadata += (("retry-after", f"{exc.retry_after_s:g}"),)
        if isinstance(exc, MalformedRequest):
            _MISTAKES.report(str(context.peer()), method, exc.message)
        await context.abort(exc.code, bounded(exc.message), trailing_metadata=metadata)
    log.error("internal error in an RPC", exc_info=exc)
    await context.abort(
        grpc.StatusCode.INTERNAL, "internal error; see the server log", trailing_metadata=metadata
    )


def _is_abort(exc: BaseException) -> bool:
    # context.abort raises grpc's own AbortError, which must pass through as is.
    return type(exc).__name__ == "AbortError" or isinstance(exc, grpc.RpcError)


def _wrap_unary(
    behaviour: Callable[..., Awaitable[Any]], method: str
) -> Callable[..., Awaitable[Any]]:
    async def wrapped(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        try:
            # An undecodable request raises here; a stream's messages are checked by their
            # reader (`StreamSession`), and its iterator passes through.
            return await behaviour(checked(request), context)
        except Exception as exc:
            if _is_abort(exc):
                raise
            await abort_for(exc, context, method)

    return wrapped


def _wrap_stream(
    behaviour: Callable[..., AsyncIterator[Any]], method: str
) -> Callable[..., AsyncIterator[Any]]:
    async def wrapped(request: Any, context: aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        try:
            async for item in behaviour(request, context):
                yield item
        except Exception as exc:
            if _is_abort(exc):
                raise
            await abort_for(exc, context, method)

    return wrapped


def _gated(behaviour: Any, fleet: FleetIdentity) -> Any:
    """``behaviour``, run only for a fleet server's connection (the check needs the call's
    auth context, which only the handler sees)."""
    if inspect.isasyncgenfunction(behaviour):

        async def stream(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
            fleet.check_forwarded(context)
            async for item in behaviour(request, context):
                yield item

        return stream

    async def call(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        fleet.check_forwarded(context)
        return await behaviour(request, context)

    return call


def _refuse(error: PtcError, method: str) -> Callable[..., Awaitable[Any]]:
    async def refuse(request_iterator: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        await abort_for(error, context, method)

    return refuse


class ErrorInterceptor(aio.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(self, tenancy: Tenancy | None = None, fleet: FleetIdentity | None = None) -> None:
        self.tenancy = tenancy
        self.fleet = fleet or FleetIdentity(None)  # without a fleet CA nobody is a server
        # The wrapped handler of each (method, carried or not), built on its first call: it
        # depends on nothing else of a call (its credential is checked per call, before this).
        # Keyed also by gRPC's own handler, so a handler registered anew is wrapped anew.
        self._wrapped: dict[tuple[str, bool], tuple[Any, Any]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler: Any = await continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(SERVICE_PREFIX):
            return handler
        name = handler_call_details.method[len(SERVICE_PREFIX) :]
        if self.tenancy is not None and handler.unary_unary is not None:
            try:
                authenticate(self.tenancy, handler_call_details.invocation_metadata)
            except PtcError as exc:
                # Registered as taking a stream, the refusal never reads the request: an
                # unauthenticated caller's message is not received, however large. Not for
                # ExecuteStream: refused before its first message, the SDK's write raced the
                # refusal and saw "Internal error from Core" (6 of 60 tries), so the servicer
                # reads that message (bounded by the receive limit) before refusing.
                return grpc.stream_unary_rpc_method_handler(
                    _refuse(exc, name), **_serializers(handler, name)
                )
        forwarded = any(
            key == FORWARDED_BY for key, _ in handler_call_details.invocation_metadata or ()
        )
        cached = self._wrapped.get((name, forwarded))
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(handler, name, forwarded)
        self._wrapped[(name, forwarded)] = (handler, wrapped)
        return wrapped

    def _wrap(self, handler: Any, name: str, forwarded: bool) -> Any:
        """gRPC's ``handler`` of method ``name``, wrapped (see the module docstring)."""
        common = _serializers(handler, name)

        def gate(behaviour: Any) -> Any:
            return _gated(behaviour, self.fleet) if forwarded else behaviour

        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(gate(handler.unary_unary), name), **common
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                _wrap_unary(gate(handler.stream_unary), name), **common
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(gate(handler.unary_stream), name), **common
            )
        behaviour = gate(handler.stream_stream)
        # A handler that reads and writes through its context is a coroutine, not a generator.
        wrap = _wrap_stream if inspect.isasyncgenfunction(behaviour) else _wrap_unary
        return grpc.stream_stream_rpc_method_handler(wrap(behaviour, name), **common)


def _serializers(handler: Any, name: str) -> dict[str, Any]:
    """The method's request decoder (`boundary.tolerant_decoder` for ours) and encoder."""
    request_type = _REQUEST_TYPES.get(name)
    return {
        "request_deserializer": handler.request_deserializer
        if request_type is None
        else tolerant_decoder(request_type),
        "response_serializer": handler.response_serializer,
    }
