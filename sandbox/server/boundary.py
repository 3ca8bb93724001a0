"""The server's edge with untrusted bytes: decoding requests, authenticating callers before a
request is read, and reporting a client's mistakes without flooding the log.

gRPC decodes a request before any handler runs, and a failure there surfaces as UNKNOWN with an
ERROR traceback. Instead every method is registered (by `interceptors.ErrorInterceptor`) with a
decoder that never raises: bytes that are not a valid message of the method's type become an
`Undecodable` naming the field where decoding failed (found by walking the wire format against
the message's descriptor), which the method's wrapper, or `StreamSession` for each streamed
message, turns into `MalformedRequest` (INVALID_ARGUMENT).

A credential is checked from the call's metadata alone, before its request is read: an
unauthenticated unary call is refused without receiving its message, so an oversized request
from nobody costs nothing. Two ``authorization`` entries are ambiguous and refused.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from sandbox.errors import MalformedRequest, Unauthenticated, bounded
from sandbox.request_caps import MAX_MANIFEST_BYTES, MAX_SCRIPT_BYTES
from sandbox.tenants.base import Tenancy, Tenant

__all__ = [
    "ClientMistakes",
    "Undecodable",
    "authenticate",
    "checked",
    "locate_decode_error",
    "tolerant_decoder",
]

log = logging.getLogger(__name__)
# protobuf's own limit on nested messages.
MAX_DEPTH = 100
# Fields with a documented size cap (`sandbox.limits`), by full name: a request larger than a
# cap is refused from its wire form, before a string as large is built from it, with the
# message the engine gives. Input files are bounded by the receive limit and the limits.
_PACKAGE = "ptc.sandbox.v1."
FIELD_CAPS = {
    _PACKAGE + "ExecuteRequest.script": ("script", MAX_SCRIPT_BYTES),
    _PACKAGE + "ToolManifest.json": ("manifest", MAX_MANIFEST_BYTES),
}
# A walk looks at this many fields at most. A valid request has a few thousand at most (1024
# input files, 256 expected calls, 64 labels, each a few fields), so a large request with more is
# refused from its size walk: protobuf's own decoder, which runs on the event loop, took 3 s for
# 60 MB of tiny fields. The walk after a failed decode gives up there instead.
MAX_WALKED_FIELDS = 10_000
SMALLEST_CAP = min(cap for _, cap in FIELD_CAPS.values())


@dataclass(frozen=True)
class Undecodable:
    """What a tolerant decoder returns for bytes that are not a valid message."""

    message: str  # names the field: ``start.limits: truncated ...``


class _Oversized(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def tolerant_decoder(cls: type[Message]) -> Callable[[bytes], Message | Undecodable]:
    """A request deserializer for ``cls`` that returns `Undecodable` instead of raising."""

    def decode(data: bytes) -> Message | Undecodable:
        if len(data) > SMALLEST_CAP:
            try:
                _sizes(cls.DESCRIPTOR, memoryview(data), [0])
            except _Oversized as exc:
                return Undecodable(exc.message or _too_many(cls.DESCRIPTOR))
        try:
            return cls.FromString(data)
        except (DecodeError, RuntimeError, ValueError) as exc:
            return Undecodable(locate_decode_error(cls.DESCRIPTOR, data, str(exc)))

    return decode


def checked(request: Any) -> Any:
    """``request`` itself, or `MalformedRequest` when it could not be decoded."""
    if isinstance(request, Undecodable):
        raise MalformedRequest(request.message)
    return request


def locate_decode_error(descriptor: Any, data: bytes, reason: str = "") -> str:
    """Where ``data`` stops being a valid ``descriptor`` message, as ``field.path: problem``;
    the message type's name when the walk finds nothing (then with protobuf's own reason)."""
    problem = _walk(descriptor, memoryview(data), "", 0, [0])
    if problem is not None:
        return problem
    detail = f" ({bounded(reason, 200)})" if reason else ""
    return f"{descriptor.name}: not a valid {descriptor.full_name} message{detail}"


def _sizes(descriptor: Any, data: memoryview, walked: list[int]) -> None:
    """Raises `_Oversized` for a field over its cap in `FIELD_CAPS`, or (with no message) past
    `MAX_WALKED_FIELDS` fields; stops quietly at anything malformed (the decoder reports it)."""
    pos = 0
    while pos < len(data):
        walked[0] += 1
        if walked[0] > MAX_WALKED_FIELDS:
            raise _Oversized("")
        if (tag := _varint(data, pos)) is None:
            return
        key, pos = tag
        wire_type = key & 7
        if wire_type == 0:
            if (value := _varint(data, pos)) is None:
                return
            pos = value[1]
        elif wire_type in (1, 5):
            pos += 8 if wire_type == 1 else 4
        elif wire_type == 2:
            if (length := _varint(data, pos)) is None:
                return
            size, pos = length
            field = descriptor.fields_by_number.get(key >> 3)
            if field is not None:
                cap = FIELD_CAPS.get(field.full_name)
                if cap is not None and size > cap[1]:
                    raise _Oversized(f"{cap[0]}: larger than {cap[1]} bytes")
                if field.type == FieldDescriptor.TYPE_MESSAGE and size > SMALLEST_CAP:
                    _sizes(field.message_type, data[pos : pos + size], walked)
            pos += size
        else:
            return


def _too_many(descriptor: Any) -> str:
    return (
        f"{descriptor.name}: more than {MAX_WALKED_FIELDS} fields (a valid request has a few "
        "thousand at most)"
    )


def _varint(data: memoryview, pos: int) -> tuple[int, int] | None:
    value = shift = 0
    while pos < len(data) and shift < 70:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    return None


def _walk(
    descriptor: Any, data: memoryview, path: str, depth: int, walked: list[int]
) -> str | None:
    """The first problem in ``data`` as a ``descriptor`` message, or None if none is found
    (also when the walk gives up after `MAX_WALKED_FIELDS` fields: it runs on the event loop)."""
    where = path or descriptor.name
    if depth > MAX_DEPTH:
        return f"{where}: nested more than {MAX_DEPTH} messages deep"
    pos = 0
    while pos < len(data):
        walked[0] += 1
        if walked[0] > MAX_WALKED_FIELDS:
            return None
        start = pos
        tag = _varint(data, pos)
        if tag is None:
            return f"{where}: truncated field tag at byte {start} of {len(data)}"
        key, pos = tag
        number, wire_type = key >> 3, key & 7
        field = descriptor.fields_by_number.get(number)
        if field is not None:
            here = f"{path}.{field.name}" if path else field.name
        else:  # a number the type does not declare: named as the wire names it
            here = f"{where}: field number {number}"
        if number == 0:
            return f"{where}: field number 0 at byte {start} (not protobuf)"
        if wire_type == 0:
            value = _varint(data, pos)
            if value is None:
                return f"{here}: truncated varint at byte {pos} of {len(data)}"
            pos = value[1]
        elif wire_type in (1, 5):
            size = 8 if wire_type == 1 else 4
            if pos + size > len(data):
                return f"{here}: truncated at byte {pos} of {len(data)} ({size} bytes expected)"
            pos += size
        elif wire_type == 2:
            length = _varint(data, pos)
            if length is None:
                return f"{here}: truncated length at byte {pos} of {len(data)}"
            size, pos = length
            if pos + size > len(data):
                return f"{here}: {size} bytes declared at byte {pos}, {len(data) - pos} present"
            chunk = data[pos : pos + size]
            pos += size
            problem = _check_chunk(field, chunk, here, depth, walked)
            if problem is not None:
                return problem
        else:
            return f"{here}: wire type {wire_type} is not used by this service"
    return None


def _check_chunk(
    field: Any, chunk: memoryview, here: str, depth: int, walked: list[int]
) -> str | None:
    if field is None:
        return None  # unknown fields are kept as bytes, never decoded
    if field.type == FieldDescriptor.TYPE_STRING:
        try:
            str(chunk, "utf-8")
        except UnicodeDecodeError as exc:
            return f"{here}: not valid UTF-8 (byte {exc.start} of {len(chunk)})"
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        return _walk(field.message_type, chunk, here, depth + 1, walked)
    return None


def authenticate(tenancy: Tenancy, metadata: Iterable[tuple[str, Any]] | None) -> Tenant:
    """The caller's tenant from the call's metadata; refuses two credentials."""
    pairs = [(str(k).lower(), str(v)) for k, v in (metadata or ())]
    count = sum(1 for key, _ in pairs if key == "authorization")
    if count > 1:
        raise Unauthenticated(
            f"authorization: sent {count} times; send exactly one 'Bearer <API key>'"
        )
    return tenancy.authenticate(dict(pairs))


class ClientMistakes:
    """One bounded WARNING line per malformed request, at most one per ``every_s`` (the lines
    left out are counted in the next one): a client cannot flood the log."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s = every_s
        self._last = -float("inf")
        self._skipped = 0

    def report(self, peer: str, method: str, message: str) -> None:
        now = time.monotonic()
        if now - self._last < self.every_s:
            self._skipped += 1
            return
        skipped, self._skipped, self._last = self._skipped, 0, now
        more = f" ({skipped} more since the last report)" if skipped else ""
        log.warning(
            "malformed request from %s to %s: %s%s",
            bounded(peer, 100),
            method,
            bounded(message, 300),
            more,
        )
