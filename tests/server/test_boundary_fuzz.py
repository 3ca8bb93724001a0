"""Random and corrupt messages to every RPC of a real `ptc serve`, generated from the .proto's
message descriptors: each answer is a result or one of the documented status codes, with a
bounded message that names a field of the request (or its type, for bytes that are no message
at all), and the server logs nothing at ERROR and keeps serving.

Generation follows the descriptors, so a field added to the proto is fuzzed without touching
this file: every scalar over its whole range and at its edges, enums with numbers they do not
declare, strings of any Unicode and some long ones, nested messages a few levels deep. Each
encoded request is then sent as it is, truncated, with a byte changed, with a string field that
is not UTF-8 appended, or replaced by random bytes. The number of examples is bounded so that
the test runs in the normal suite in well under a minute.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox._proto import sandbox_pb2 as pb
from sandbox.client import Client
from sandbox.errors import MAX_STATUS_CHARS
from tests.ptc_serve import Serving, ptc_serve

SERVICE = pb.DESCRIPTOR.services_by_name["SandboxService"]
PREFIX = f"/{SERVICE.full_name}/"
# Every code a client mistake or a busy server may get; never UNKNOWN or INTERNAL. A deadline is
# the client's own (a random script may run); UNAVAILABLE is a backend this server lacks.
DOCUMENTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}
CALL_TIMEOUT_S = 10.0
MAX_DEPTH = 3
_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def _names(descriptor: Descriptor, seen: set[str]) -> set[str]:
    """Every field and oneof name reachable from ``descriptor``, and the message types'."""
    if descriptor.full_name in seen:
        return set()
    seen.add(descriptor.full_name)
    names = {descriptor.name, *descriptor.oneofs_by_name}
    for field in descriptor.fields:
        names.add(field.name)
        if field.message_type is not None:
            names |= _names(field.message_type, seen)
    return names


def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    edges = sorted(v for v in {low, low + 1, -1, 0, 1, 1000, high - 1, high} if low <= v <= high)
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind in _INT_RANGES:
        return _integers(*_INT_RANGES[kind])
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_DOUBLE:
        return st.floats()
    if kind == FieldDescriptor.TYPE_FLOAT:
        return st.floats(width=32)
    if kind == FieldDescriptor.TYPE_STRING:
        # Valid Unicode only (what UTF-8 encodes: all but the surrogates): protobuf cannot
        # serialize a lone surrogate; invalid UTF-8 on the
        # wire is the "bad-utf8" corruption's job (`corrupted`).
        chars = st.characters(codec="utf-8")
        long = st.builds(lambda c, n: c * n, chars, st.integers(1000, 50_000))
        return st.one_of(st.text(chars, max_size=30), st.sampled_from(["", "print(1)", "[]"]), long)
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if kind == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None, field.full_name
        declared = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(declared), _integers(-(2**31), 2**31 - 1))
    raise AssertionError(f"no strategy for field type {kind}")


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Random messages of ``descriptor``'s type, any field set or not."""
    cls = message_factory.GetMessageClass(descriptor)
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key, value = (
                field.message_type.fields_by_name["key"],
                field.message_type.fields_by_name["value"],
            )
            if value.message_type is None:
                optional[field.name] = st.dictionaries(_scalar(key), _scalar(value), max_size=3)
        elif field.message_type is not None:
            if depth >= MAX_DEPTH:
                continue

            def nested(d: Descriptor = field.message_type) -> st.SearchStrategy[Message]:
                return messages(d, depth + 1)

            inner = st.deferred(nested)  # a function of no arguments (not a partial)
            optional[field.name] = st.lists(inner, max_size=3) if _repeated(field) else inner
        else:
            optional[field.name] = (
                st.lists(_scalar(field), max_size=4) if _repeated(field) else _scalar(field)
            )

    def build(values: dict[str, Any]) -> Message:
        message = cls()
        for name, value in values.items():
            if isinstance(value, dict):
                getattr(message, name).update(value)
            elif isinstance(value, list):
                getattr(message, name).extend(value)
            elif isinstance(value, Message):
                getattr(message, name).CopyFrom(value)
            else:
                setattr(message, name, value)
        return message

    return st.fixed_dictionaries({}, optional=optional).map(build)


def _repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


@st.composite
def corrupted(draw: st.DrawFn, descriptor: Descriptor) -> bytes:
    """A message's bytes as they are, or spoiled in one of the ways a hostile client can."""
    data = draw(messages(descriptor)).SerializeToString()
    how = draw(st.sampled_from(["as-is", "truncated", "byte", "bad-utf8", "random"]))
    if how == "truncated" and data:
        return data[: draw(st.integers(0, len(data) - 1))]
    if how == "byte" and data:
        index = draw(st.integers(0, len(data) - 1))
        return data[:index] + bytes([draw(st.integers(0, 255))]) + data[index + 1 :]
    if how == "bad-utf8":
        strings = [f for f in descriptor.fields if f.type == FieldDescriptor.TYPE_STRING]
        if strings:
            field = draw(st.sampled_from(strings))
            junk = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"a\x80b"]))
            return data + _varint(field.number << 3 | 2) + _varint(len(junk)) + junk
    if how == "random":
        return draw(st.binary(max_size=64))
    return data


REQUESTS = st.sampled_from(list(SERVICE.methods)).flatmap(
    lambda method: st.tuples(
        st.just(method),
        st.lists(corrupted(method.input_type), min_size=1, max_size=3)
        if method.client_streaming
        else corrupted(method.input_type).map(lambda data: [data]),
    )
)


@pytest.fixture(scope="module")
def served() -> Iterator[Serving]:
    with ptc_serve("--pool-size", "2") as serving:
        yield serving
    for problem in ("Traceback", "ERROR", "Task exception was never retrieved"):
        assert problem not in serving.stderr, serving.stderr


@pytest.fixture(scope="module")
def channel(served: Serving) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(served.address) as ch:
        yield ch


def _call(channel: grpc.Channel, method: Any, payloads: list[bytes]) -> tuple[Any, str]:
    path = PREFIX + method.name
    try:
        if method.client_streaming:
            stream = channel.stream_stream(path, None, None)  # bytes as they are
            for _event in stream(iter(payloads), timeout=CALL_TIMEOUT_S):
                pass
        else:
            channel.unary_unary(path, None, None)(payloads[0], timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


FIRST_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)
@given(request=REQUESTS)
def test_every_rpc_answers_hostile_input_with_a_documented_status(served, channel, request):
    method, payloads = request
    code, details = _call(channel, method, payloads)
    assert code in DOCUMENTED, (method.name, code, details[:300])
    assert len(details) <= MAX_STATUS_CHARS + 40, (method.name, len(details))
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        names = _names(method.input_type, set())
        first = FIRST_WORD.match(details)
        assert first is not None and first.group(0) in names | {"field"}, (
            method.name,
            details[:300],
        )


def test_server_still_serves_after_the_fuzz(served, channel):
    with Client(served.address) as client:
        result = client.execute("print('still ok')")
    assert (result.status, result.stdout) == ("ok", "still ok\n")
