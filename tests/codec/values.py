"""Hypothesis strategies for the values `sandbox.codec` carries, each field drawn from what it
can hold on the wire (strings as UTF-8, integers in their proto type's range, durations in the
proto's unit), with unset and default fields drawn as often as set ones."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import pytest
from google.protobuf.message import Message
from hypothesis import strategies as st

from sandbox import result as r
from sandbox.errors import InvalidArgument
from sandbox.files import FileDigest, OmittedOutput, OutputFile
from sandbox.limits import LIMIT_SPECS, LimitAdjustment, ResolvedLimits

__all__ = [
    "RESULTS",
    "json_values",
    "refusal",
    "same_times",
    "texts",
    "through_the_wire",
    "times",
]

texts = st.text(max_size=12)
names = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12)
uint32 = st.integers(0, 2**32 - 1)
uint64 = st.integers(0, 2**64 - 1)
finite = st.floats(allow_nan=False, allow_infinity=False)
# Seconds since the epoch, as the house's clocks give them (to the microsecond).
times = st.integers(0, 4_000_000_000_000_000).map(lambda us: us / 1e6)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | finite | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=6,
)


@st.composite
def calls(draw: st.DrawFn) -> r.CallRecord:
    status = draw(st.sampled_from(r.CallStatus))
    ok = status == r.CallStatus.OK
    return r.CallRecord(
        seq=draw(uint64),
        tool=draw(texts),
        arguments=draw(json_values),
        status=status,
        result=draw(json_values) if ok else None,
        error=None if ok else draw(texts),
        start_offset_s=draw(st.integers(0, 2**52).map(lambda us: us / 1e6)),
        duration_s=draw(st.integers(0, 2**52).map(lambda us: us / 1e6)),
        idempotency_key=draw(texts),
    )


violations = st.builds(
    r.Violation,
    limit=texts,
    limit_value=finite,
    observed=st.none() | finite,
    unit=texts,
    action=st.sampled_from(["killed", "truncated", "refused", "reported", "interrupted"]),
    detail=texts,
    evidence=st.sampled_from(r.Evidence),
)
usages = st.builds(
    r.Usage,
    wall_time_s=st.integers(0, 2**52).map(lambda ms: ms / 1000),
    cpu_time_s=st.integers(0, 2**52).map(lambda ms: ms / 1000),
    peak_memory_bytes=uint64,
    stdout_bytes=uint64,
    stderr_bytes=uint64,
    tool_calls=uint64,
)
# Every field set (a proto uint64, at least 1), or None: a result that carries none.
resolved_limits = st.builds(
    ResolvedLimits, **{spec.field: st.integers(1, 2**64 - 1) for spec in LIMIT_SPECS}
)
effective_limits = st.none() | resolved_limits
omitted = st.builds(
    OmittedOutput,
    name=texts,
    reason=texts,
    size=st.none() | uint64,
    limit=st.none() | uint64,
    detail=texts,
)


@st.composite
def results(draw: st.DrawFn) -> r.ExecutionResult:
    return r.ExecutionResult(
        execution_id=draw(texts),
        status=draw(st.sampled_from([s for s in r.ExecutionStatus])),
        exit_code=draw(st.integers(-(2**31), 2**31 - 1)),
        stdout=draw(texts),
        stderr=draw(texts),
        calls=draw(st.lists(calls(), max_size=3)),
        violations=draw(st.lists(violations, max_size=3)),
        usage=draw(usages),
        error=draw(st.none() | st.builds(r.ScriptError, texts, texts, uint32)),
        backend=draw(st.sampled_from(["process", "docker", "gvisor", "unspecified"])),
        isolation=draw(st.lists(texts, max_size=3)),
        effective_limits=draw(effective_limits),
        adjustments=draw(
            st.lists(st.builds(LimitAdjustment, texts, finite, finite, texts), max_size=2)
        ),
        started_at=draw(times),
        finished_at=draw(times),
        session_id=draw(texts),
        value=draw(st.none() | texts),
        session_lost=draw(texts),
        input_files=draw(st.lists(st.builds(FileDigest, texts, uint64, texts), max_size=2)),
        output_files=draw(
            st.lists(st.builds(OutputFile, texts, uint64, texts, st.binary(max_size=8)), max_size=2)
        ),
        omitted_outputs=draw(st.lists(omitted, max_size=2)),
    )


RESULTS = results()


_Value = TypeVar("_Value")


def same_times(
    back: _Value, sent: _Value, names: tuple[str, ...] = ("started_at", "finished_at")
) -> _Value:
    """``back`` with ``sent``'s times (``names``) where the two are one float apart: a time
    goes out as whole nanoseconds, and a float second of today has about 0.5 us between
    neighbours, so that the nanoseconds can read back as the neighbour. Any other difference
    stays, for the comparison to show."""
    agreed: dict[str, Any] = {}
    for name in names:
        got, want = getattr(back, name), getattr(sent, name)
        if got is not None and want is not None and abs(got - want) <= math.ulp(want):
            agreed[name] = want
    return replace(back, **agreed)  # type: ignore[type-var]


_Sent = TypeVar("_Sent")
_Message = TypeVar("_Message", bound=Message)


def through_the_wire(
    value: _Sent, encode: Callable[[_Sent], _Message], decode: Callable[[_Message], _Value]
) -> _Value:
    """``value`` encoded, serialised to bytes and parsed back as a peer would, then decoded."""
    message = encode(value)
    return decode(type(message).FromString(message.SerializeToString()))


def refusal(decode: Callable[[_Message], object], message: _Message) -> str:
    """The message of the `InvalidArgument` that ``decode`` raises for ``message``."""
    with pytest.raises(InvalidArgument) as refused:
        decode(message)
    return str(refused.value)
