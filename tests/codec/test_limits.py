"""Limits cross the wire whole: a request's `Limits` (each field set or inheriting) through
`limits_to_proto` and `limits_from_proto`, and the effective limits a result carries (``{field:
value}``) through `limits_to_proto` and `limits_fields_from_proto`, back to `ResolvedLimits`
through `ResolvedLimits.from_fields`; a record written before limits were keyed by field (limit
names in report units) still reads as the same fields."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox._proto import sandbox_pb2 as pb
from sandbox.codec.limits import limits_fields_from_proto, limits_from_proto, limits_to_proto
from sandbox.errors import InvalidLimits
from sandbox.limits import DEFAULTS, LIMIT_SPECS, Limits, ResolvedLimits


@st.composite
def limits(draw: st.DrawFn) -> Limits:
    chosen = draw(st.lists(st.sampled_from(LIMIT_SPECS), max_size=len(LIMIT_SPECS), unique=True))
    return Limits(**{s.field: draw(st.integers(s.minimum, 2**63)) for s in chosen})


def _sent(message: pb.Limits) -> pb.Limits:
    return pb.Limits.FromString(message.SerializeToString())


@settings(max_examples=100, deadline=None)
@given(asked=limits())
def test_any_requests_limits_read_back_as_they_were_written(asked: Limits) -> None:
    assert limits_from_proto(_sent(limits_to_proto(asked))) == asked


@settings(max_examples=100, deadline=None)
@given(
    fields=st.dictionaries(
        st.sampled_from([s.field for s in LIMIT_SPECS]), st.integers(0, 2**64 - 1)
    )
)
def test_any_effective_limits_read_back_as_they_were_written(fields: dict[str, int]) -> None:
    assert limits_fields_from_proto(_sent(limits_to_proto(fields))) == fields


def test_resolved_limits_and_an_older_records_names_read_as_the_same_fields() -> None:
    every = {s.field: DEFAULTS.value(s.name) for s in LIMIT_SPECS}
    assert limits_fields_from_proto(limits_to_proto(DEFAULTS)) == every
    older = {"wall_time": 2.5, "memory": 268_435_456}  # names, seconds and bytes
    assert limits_fields_from_proto(limits_to_proto(older)) == {
        "wall_time_ms": 2500,
        "memory_bytes": 268_435_456,
    }


@settings(max_examples=50, deadline=None)
@given(values=st.lists(st.integers(1, 2**40), min_size=len(LIMIT_SPECS), max_size=len(LIMIT_SPECS)))
def test_resolved_limits_travel_typed_through_their_fields(values: list[int]) -> None:
    resolved = ResolvedLimits(
        **{s.field: max(v, s.minimum) for s, v in zip(LIMIT_SPECS, values, strict=True)}
    )
    fields = limits_fields_from_proto(_sent(limits_to_proto(resolved)))
    assert ResolvedLimits.from_fields(fields) == resolved


def test_effective_limits_missing_a_field_or_under_a_minimum_are_refused_naming_it() -> None:
    every = {s.field: DEFAULTS.value(s.name) for s in LIMIT_SPECS}
    with pytest.raises(InvalidLimits) as lacking:
        ResolvedLimits.from_fields({**every, "memory_bytes": None}, "recorded")
    assert str(lacking.value).startswith("recorded.memory_bytes: must be a positive integer")
    partial = {k: v for k, v in every.items() if k not in ("open_files", "processes")}
    with pytest.raises(InvalidLimits) as missing:
        ResolvedLimits.from_fields(partial, "recorded")
    assert str(missing.value) == "recorded: lacks processes, open_files"
