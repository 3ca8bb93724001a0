"""Limits cross the wire whole: a request's `Limits` (each field set or inheriting) through
`limits_to_proto` and `limits_from_proto`; the effective limits a result or a record carries,
the typed `ResolvedLimits`, through `limits_to_proto` and `resolved_from_proto`, and through
their JSON (`ResolvedLimits.to_fields` and `from_record`). Limits in a format written before
every limit was recorded by field read back as None, never as made-up values."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox._proto import sandbox_pb2 as pb
from sandbox.codec.limits import (
    limits_fields_from_proto,
    limits_from_proto,
    limits_to_proto,
    resolved_from_proto,
)
from sandbox.errors import InvalidLimits
from sandbox.limits import DEFAULTS, LIMIT_SPECS, Limits, ResolvedLimits
from sandbox.older_limits import OlderLimits, limits_json
from tests.codec.values import resolved_limits


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
@given(resolved=resolved_limits)
def test_any_effective_limits_read_back_typed_as_they_were_written(
    resolved: ResolvedLimits,
) -> None:
    assert resolved_from_proto(_sent(limits_to_proto(resolved))) == resolved
    assert ResolvedLimits.from_record(resolved.to_fields()) == resolved


def test_no_effective_limits_travel_as_an_empty_message_and_read_back_as_none() -> None:
    assert limits_to_proto(None) == pb.Limits()
    assert resolved_from_proto(_sent(pb.Limits())) is None
    # From a server before every limit was sent: no complete set, so none made up.
    assert resolved_from_proto(_sent(pb.Limits(wall_time_ms=1000, memory_bytes=1 << 28))) is None


def test_the_fields_are_the_proto_names_in_canonical_integers_in_spec_order() -> None:
    limits = replace(DEFAULTS, wall_time_ms=2500)
    fields = limits.to_fields()
    assert list(fields) == [s.field for s in LIMIT_SPECS]
    assert fields["wall_time_ms"] == 2500 and fields["memory_bytes"] == 256 * 1024**2
    assert all(type(v) is int for v in fields.values())
    fields["wall_time_ms"] = 1  # a copy: the one remembered is not changed
    assert limits.to_fields()["wall_time_ms"] == 2500
    assert limits_json(None) == {}
    assert limits_json(limits) == limits.to_fields()


def test_a_records_limits_json_is_the_complete_set_else_the_older_as_written_else_empty() -> None:
    """One rule for every writer of limits as JSON (results, admissions, sessions, replays)."""
    older = OlderLimits((("wall_time", 10.0), ("memory", 268435456.0)))
    assert limits_json(DEFAULTS, older) == DEFAULTS.to_fields()
    assert limits_json(None, older) == {"memory": 268435456.0, "wall_time": 10.0}
    assert limits_json(None, None) == {}


def test_a_record_in_an_older_format_reads_back_as_none() -> None:
    every = DEFAULTS.to_fields()
    assert ResolvedLimits.from_record({}) is None
    # Limit names in report units (seconds), as the first records were written.
    assert ResolvedLimits.from_record({"wall_time": 10.0, "memory": 268435456.0}) is None
    # By field, without a limit added since.
    assert (
        ResolvedLimits.from_record({k: v for k, v in every.items() if k != "output_bytes"}) is None
    )


def test_a_record_is_read_as_written_under_todays_minimums_and_integral_floats() -> None:
    small = {**DEFAULTS.to_fields(), "memory_bytes": 8 * 1024**2}  # under today's 32 MiB
    assert ResolvedLimits.from_record(small) == replace(DEFAULTS, memory_bytes=8 * 1024**2)
    floats = {k: float(v) for k, v in DEFAULTS.to_fields().items()}
    assert ResolvedLimits.from_record(floats) == DEFAULTS


def test_a_bad_recorded_limit_is_refused_naming_it() -> None:
    every = DEFAULTS.to_fields()
    with pytest.raises(InvalidLimits) as bad:
        ResolvedLimits.from_record({**every, "memory_bytes": None}, "recorded")
    assert str(bad.value) == "recorded.memory_bytes: must be a positive integer (bytes), got None"
    with pytest.raises(InvalidLimits) as half:
        ResolvedLimits.from_record({**every, "wall_time_ms": 2.5}, "recorded")
    assert str(half.value) == "recorded.wall_time_ms: must be a positive integer (ms), got 2.5"
    with pytest.raises(InvalidLimits) as zero:
        ResolvedLimits.from_record({**every, "processes": 0}, "recorded")
    assert str(zero.value) == "recorded.processes: must be a positive integer (count), got 0"
    with pytest.raises(InvalidLimits) as flag:
        ResolvedLimits.from_record({**every, "open_files": True}, "recorded")
    assert str(flag.value) == "recorded.open_files: must be a positive integer (count), got True"
    with pytest.raises(InvalidLimits) as unknown:
        ResolvedLimits.from_record({**every, "gpus": 1}, "recorded")
    assert str(unknown.value).startswith("recorded.gpus: unknown limit (known: wall_time_ms, ")
    with pytest.raises(InvalidLimits) as shape:
        ResolvedLimits.from_record([1, 2], "recorded")
    assert str(shape.value) == "recorded: expected an object of limits, got list"


def test_a_sessions_limits_read_back_as_the_fields_set() -> None:
    # A live session shows its whole-sandbox limits only.
    assert limits_fields_from_proto(_sent(pb.Limits(cpu_time_ms=7, output_bytes=9))) == {
        "cpu_time_ms": 7,
        "output_bytes": 9,
    }
