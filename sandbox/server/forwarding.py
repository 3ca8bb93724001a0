"""Carrying a session call to the server that holds the session: any server serves any session.

A session's sandbox lives in one server's memory. A call for it (Execute and ExecuteStream with a
``session_id``, GetSession, CloseSession) that reaches another server of the fleet is routed
here, in the server layer, before the session manager is asked:

    held here (open or ended)             → answered here
    held by a live server elsewhere       → carried to it (`Forwarder.unary`, `Forwarder.stream`)
    holder dead, gone, or the id unknown  → answered here by the manager (NOT_FOUND today)

"Held by" is the store's answer (`AuditStore.holder`: the open session's record names the
server that admitted it, whose lease row says where it listens and whether it is alive). A call
that was itself carried (metadata `peers.FORWARDED_BY`) is never carried again: its receiver
answers as it would locally, so two servers that disagree cannot bounce a call between them.

The carried call is the caller's own: same request bytes, the caller's ``authorization`` (so the
holder authenticates the tenant itself: a forwarder cannot act as a tenant it could not
authenticate) and trace context, the remaining deadline, plus the fleet's proof that the call
comes from a server (`peers.FleetIdentity.outgoing_metadata`; under TLS the fleet certificate
travels in the handshake, `FleetChannels`). The holder's answer comes back unchanged: a response,
or its error with the same status, message and trailing metadata. The holder marks its own errors
(`peers.HOLDER_ANSWER`), so an error the transport made is told apart: the holder unreachable
before or during the call is UNAVAILABLE naming the holder. ExecuteStream is relayed both ways
message by message (output, tool calls and their answers, approvals, cancel), in order.

ListSessions lists the tenant's sessions fleet-wide by asking every live member for its own
(each a carried ListSessions, answered locally there) and merging them with this server's: only
the holder knows a session's live state (its cells, the one running, when it was last used), which
the store's records do not keep. A member that cannot be reached is left out and logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from google.protobuf.message import Message
from grpc import aio

from sandbox._proto import sandbox_pb2 as pb
from sandbox._proto import sandbox_pb2_grpc as pb_grpc
from sandbox.audit.base import AuditStore, Holder, Member
from sandbox.errors import PtcError, Unavailable, quote
from sandbox.keepalive import Keepalive, is_keepalive_failure
from sandbox.server.boundary import checked
from sandbox.server.peers import FORWARDED_BY, HOLDER_ANSWER, FleetIdentity

__all__ = ["FleetChannels", "Forwarder", "is_forwarded"]

log = logging.getLogger(__name__)
Context = aio.ServicerContext[Any, Any]
CARRIED_METADATA = ("authorization", "traceparent", "tracestate")
LIST_TIMEOUT_S = 10.0  # a member's answer to a fleet-wide ListSessions, when the call has none


def is_forwarded(context: Context) -> bool:
    return any(key == FORWARDED_BY for key, _ in context.invocation_metadata() or ())


class FleetChannels:
    """One channel per peer address, opened on first use: plaintext, or TLS that trusts
    ``peer_ca`` (None: the system's CAs) and presents the fleet certificate when given. With
    ``keepalive`` pings, so that a call carried to a holder that froze ends (UNAVAILABLE naming
    the holder) instead of waiting for ever."""

    def __init__(
        self,
        credentials: grpc.ChannelCredentials | None,
        max_bytes: int,
        keepalive: Keepalive | None = None,
    ) -> None:
        self.credentials = credentials
        self.keepalive = keepalive or Keepalive()
        self.options: list[tuple[str, int]] = [
            ("grpc.max_send_message_length", max_bytes),
            ("grpc.max_receive_message_length", max_bytes),
            *self.keepalive.channel_options(),
        ]
        self._channels: dict[str, aio.Channel] = {}

    def stub(self, address: str) -> pb_grpc.SandboxServiceStub:
        channel = self._channels.get(address)
        if channel is None:
            if self.credentials is None:
                channel = aio.insecure_channel(address, options=self.options)
            else:
                channel = aio.secure_channel(address, self.credentials, options=self.options)
            self._channels[address] = channel
        return pb_grpc.SandboxServiceStub(channel)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close(None)


class Forwarder:
    """Routes session calls to their holder (the module docstring says how)."""

    def __init__(
        self,
        store: AuditStore,
        identity: FleetIdentity,
        channels: FleetChannels,
        *,
        instance: str,
        holds: Callable[[str], bool],
    ) -> None:
        self.store = store
        self.identity = identity
        self.channels = channels
        self.instance = instance
        self.holds = holds  # True for a session this server holds (open, or ended here)
        self.address = ""  # this server's advertised address, set once it listens

    # -- routing -------------------------------------------------------------------------------
    async def holder_of(self, context: Context, tenant: str, session_id: str) -> Holder | None:
        """The live server elsewhere that holds the session; None to answer here."""
        if not session_id or not self.address or is_forwarded(context) or self.holds(session_id):
            return None
        found = await asyncio.to_thread(self.store.holder, tenant, session_id)
        if found is None or not found.alive or found.instance == self.instance:
            return None
        return found

    def _metadata(self, context: Context) -> tuple[tuple[str, str], ...]:
        carried = tuple(
            (str(k), str(v))
            for k, v in context.invocation_metadata() or ()
            if str(k).lower() in CARRIED_METADATA
        )
        return carried + self.identity.outgoing_metadata(self.address)

    # -- unary ---------------------------------------------------------------------------------
    async def unary(self, holder: Member, method: str, request: Message, context: Context) -> Any:
        """``method`` of the holder with ``request``: its answer, or its error unchanged."""
        call = getattr(self.channels.stub(holder.address), method)
        try:
            return await call(
                request, metadata=self._metadata(context), timeout=context.time_remaining()
            )
        except aio.AioRpcError as exc:
            await _answer_error(holder, exc, context)

    # -- streams -------------------------------------------------------------------------------
    async def stream(self, holder: Member, first: pb.ClientMessage, context: Context) -> None:
        """Relays an ExecuteStream both ways between the client and the holder."""
        call = self.channels.stub(holder.address).ExecuteStream(
            metadata=self._metadata(context), timeout=context.time_remaining()
        )
        up = asyncio.create_task(_client_to_holder(context, call, first))
        down = asyncio.create_task(_holder_to_client(call, context))
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            failed = up.exception() if up.done() and not up.cancelled() else None
            if isinstance(failed, PtcError):  # a malformed client message: refused here
                raise failed
            error = await down  # the holder ends the call (a failed write up means it did)
            if error is not None:
                await _answer_error(holder, error, context)
        finally:
            for task in (up, down):
                task.cancel()
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.gather(up, down)

    # -- listing -------------------------------------------------------------------------------
    async def list_elsewhere(
        self, request: pb.ListSessionsRequest, context: Context
    ) -> list[pb.SessionInfo]:
        """The tenant's sessions every other live member holds; none for a carried call."""
        if is_forwarded(context) or not self.address:
            return []
        members = await asyncio.to_thread(self.store.members)
        answers = await asyncio.gather(
            *(self._list_one(member, request, context) for member in members)
        )
        return [info for found in answers for info in found]

    async def _list_one(
        self, member: Member, request: pb.ListSessionsRequest, context: Context
    ) -> Sequence[pb.SessionInfo]:
        stub = self.channels.stub(member.address)
        remaining = context.time_remaining()
        try:
            reply = await stub.ListSessions(
                request,
                metadata=self._metadata(context),
                timeout=LIST_TIMEOUT_S if remaining is None else remaining,
            )
        except aio.AioRpcError as exc:
            if _from_holder(exc):
                await _answer_error(member, exc, context)
            log.warning(
                "fleet: ListSessions left out server %s at %s, which did not answer: %s",
                member.instance,
                member.address,
                exc.details(),
            )
            return []
        return list(reply.sessions)


async def _client_to_holder(context: Context, call: Any, first: pb.ClientMessage) -> None:
    """The client's messages, in order, to the holder; half-closes when the client does."""
    await call.write(first)
    while isinstance(message := checked(await context.read()), pb.ClientMessage):
        await call.write(message)
    with contextlib.suppress(Exception):  # the holder may have ended the call already
        await call.done_writing()


async def _holder_to_client(call: Any, context: Context) -> aio.AioRpcError | None:
    """The holder's events, in order, to the client; the holder's error, if it ended in one."""
    try:
        async for event in call:
            await context.write(event)
    except aio.AioRpcError as exc:
        return exc
    return None


def _trailing(exc: aio.AioRpcError) -> list[tuple[str, Any]]:
    return [(str(item[0]), item[1]) for item in exc.trailing_metadata() or ()]  # type: ignore[index]


def _from_holder(exc: aio.AioRpcError) -> bool:
    return any(key == HOLDER_ANSWER for key, _ in _trailing(exc))


async def _answer_error(holder: Member, exc: aio.AioRpcError, context: Context) -> None:
    """Ends the call with the holder's error unchanged, or, when the transport failed before
    the holder answered, with UNAVAILABLE naming the holder. Always raises."""
    if _from_holder(exc) or exc.code() != grpc.StatusCode.UNAVAILABLE:
        trailing = tuple((k, v) for k, v in _trailing(exc) if k != HOLDER_ANSWER)
        await context.abort(exc.code(), exc.details() or "", trailing_metadata=trailing)
    details = exc.details() or ""
    raise Unavailable(
        f"session_id: the server holding the session ({holder.instance} at "
        f"{quote(holder.address)}) cannot be reached: {details}"
        + (" (it stopped answering keepalive pings)" if is_keepalive_failure(details) else "")
    )
