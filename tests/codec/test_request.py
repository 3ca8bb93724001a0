"""A request crosses the wire whole: `request_to_proto` then `request_from_proto` gives back the
same `Request` (script, manifest, `RunOptions`), for one with nothing set and for any drawn below;
what is not on the wire (the call's deadline) reads back as its default; a bad field is refused
on the way in with a message naming it, exactly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox._proto import sandbox_pb2 as pb
from sandbox.codec.request import Request, request_from_proto, request_to_proto
from sandbox.expectations import ExpectedCalls
from sandbox.files import InputFile
from sandbox.limits import LIMIT_SPECS, Limits
from sandbox.options import RunOptions
from tests.codec.values import names, refusal, texts, through_the_wire


@st.composite
def limits(draw: st.DrawFn) -> Limits | None:
    """None, or a `Limits` with at least one field set, each at or above its minimum (an empty
    `Limits` and None are one on the wire: no field set)."""
    chosen = draw(st.lists(st.sampled_from(LIMIT_SPECS), min_size=1, max_size=4, unique=True))
    if draw(st.booleans()):
        return None
    return Limits(**{s.field: draw(st.integers(s.minimum, s.minimum * 1000)) for s in chosen})


@st.composite
def expected(draw: st.DrawFn) -> ExpectedCalls:
    low = draw(st.none() | st.integers(0, 50))
    high = draw(st.none() | st.integers(low or 0, 100))
    return ExpectedCalls(draw(names), low, high)


OPTIONS = st.builds(
    RunOptions,
    limits=limits(),
    backend=st.sampled_from([None, "process", "docker", "gvisor"]),
    runtime=st.none() | names,
    policy=st.sampled_from([None, "none", "restricted"]),
    expected_calls=st.lists(expected(), max_size=3).map(tuple),
    files=st.lists(st.sampled_from(["in.txt", "data.csv", "x"]), unique=True, max_size=3).map(
        lambda picked: tuple(InputFile(name, name.encode() * 3) for name in picked)
    ),
    labels=st.dictionaries(names, texts, max_size=3),
    session_id=st.sampled_from(["", "s-" + "0f" * 16]),
    idempotency_key=st.none() | names,
)
REQUESTS = st.builds(
    Request,
    script=texts,
    manifest_json=st.sampled_from([None, "[]", '[{"name": "echo_it"}]']),
    options=OPTIONS,
)


def _round_trip(request: Request) -> Request:
    return through_the_wire(request, request_to_proto, request_from_proto)


@settings(max_examples=100, deadline=None)
@given(request=REQUESTS)
def test_any_request_reads_back_as_it_was_written(request: Request) -> None:
    assert _round_trip(request) == request


def test_a_request_with_nothing_set_reads_back_as_it_was_written() -> None:
    request = Request("", None)
    assert request_to_proto(request) == pb.ExecuteRequest()
    assert _round_trip(request) == request


def test_what_the_wire_does_not_carry_reads_back_as_its_default() -> None:
    sent = Request("print(1)", "[]", RunOptions(limits=Limits(), idempotency_key="", timeout=5.0))
    assert _round_trip(sent) == Request("print(1)", "[]", RunOptions())


def test_decoded_labels_are_a_copy_the_message_cannot_change() -> None:
    message = pb.ExecuteRequest(script="print(1)", labels={"team": "qa"})
    options = request_from_proto(message).options
    message.labels["team"] = "changed later"
    message.labels["extra"] = "x"
    assert dict(options.labels) == {"team": "qa"}
    with pytest.raises(TypeError):
        options.labels["team"] = "x"  # type: ignore[index]


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (pb.ExecuteRequest(backend=7), "backend: unknown value 7"),  # type: ignore[arg-type]
        (pb.ExecuteRequest(policy=9), "policy: unknown value 9"),  # type: ignore[arg-type]
        (pb.ExecuteRequest(runtime="r" * 257), "runtime: longer than 256 characters"),
        (
            pb.ExecuteRequest(expected_calls=[pb.ExpectedCalls(tool="a")] * 257),
            "expected_calls: more than 256 entries",
        ),
        (
            pb.ExecuteRequest(expected_calls=[pb.ExpectedCalls(tool="a"), pb.ExpectedCalls()]),
            "expected_calls[1].tool: is empty",
        ),
        (
            pb.ExecuteRequest(expected_calls=[pb.ExpectedCalls(tool="a", min=3, max=2)]),
            "expected_calls[0]: min 3 is above max 2",
        ),
        (
            pb.ExecuteRequest(limits=pb.Limits(memory_bytes=0)),
            "limits.memory_bytes: must be positive (leave it unset to inherit the default)",
        ),
        (
            pb.ExecuteRequest(idempotency_key="a b"),
            "idempotency_key: 'a b' has a character outside printable ASCII (or a space)",
        ),
        (
            pb.ExecuteRequest(labels={"ptc.kind": "x"}),
            "labels: key 'ptc.kind' is reserved: keys starting with 'ptc.' are set by the server",
        ),
    ],
    ids=[
        "backend",
        "policy",
        "runtime",
        "expected-calls-count",
        "expected-calls-tool",
        "expected-calls-range",
        "limits",
        "idempotency-key",
        "labels",
    ],
)
def test_a_bad_field_is_refused_naming_it(message: pb.ExecuteRequest, error: str) -> None:
    assert refusal(request_from_proto, message) == error
