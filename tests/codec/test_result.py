"""A result crosses the wire whole: `result_to_proto` then `result_from_proto` gives back the
same `ExecutionResult`, for a bare ``print(1)`` result (no calls, violations or files, which
the client skips reading), for one with every part set, and for any drawn by `RESULTS`;
statuses and limits read as before.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings

from sandbox import result as r
from sandbox._proto import sandbox_pb2 as pb
from sandbox.codec.limits import limits_from_proto
from sandbox.codec.result import result_from_proto
from sandbox.codec.result import result_to_proto as to_proto
from sandbox.errors import InvalidArgument
from sandbox.files import FileDigest, OmittedOutput, OutputFile
from sandbox.limits import CEILINGS, DEFAULTS, LimitAdjustment, Limits
from tests.codec.values import RESULTS, same_times, through_the_wire


def _bare() -> r.ExecutionResult:
    return r.ExecutionResult(
        execution_id="e" * 32,
        status=r.ExecutionStatus.OK,
        stdout="1\n",
        usage=r.Usage(
            wall_time_s=0.012, cpu_time_s=0.004, peak_memory_bytes=1 << 22, stdout_bytes=2
        ),
        isolation=["userns", "netns", "cgroup"],
        effective_limits=replace(DEFAULTS, wall_time_ms=30_000, open_files=64),
        started_at=1000.25,
        finished_at=1000.5,
    )


def _full() -> r.ExecutionResult:
    return r.ExecutionResult(
        execution_id="f" * 32,
        status=r.ExecutionStatus.LIMIT_EXCEEDED,
        exit_code=-9,
        stdout="out é\n",
        stderr="err\n",
        calls=[
            r.CallRecord(1, "search", {"q": "x"}, r.CallStatus.OK, {"hits": [1]}, None, 0.5, 0.25),
            r.CallRecord(2, "fetch", [1, 2], r.CallStatus.ERROR, None, "boom", 1.0, 0.5, "k-2"),
        ],
        violations=[
            r.Violation("wall_time", 1.0, 2.0, "s", "killed", "late", evidence=r.Evidence.HOST),
            r.Violation("stdout", 10.0, None, "bytes", "truncated", evidence=r.Evidence.GUEST),
        ],
        usage=r.Usage(0.25, 0.125, 1 << 20, 7, 4, 2),
        error=r.ScriptError("MemoryError", "too big", 3),
        backend="docker",
        isolation=["runc"],
        effective_limits=replace(CEILINGS, cpu_time_ms=1000),
        adjustments=[LimitAdjustment("memory_bytes", 1e9, 5e8)],
        started_at=1.5,
        finished_at=2.75,
        session_id="s-" + "0" * 32,
        value="42",
        session_lost="gone",
        input_files=[FileDigest("in.txt", 3, "ab" * 32)],
        output_files=[OutputFile("out.bin", 2, "cd" * 32, b"\x00\x01")],
        omitted_outputs=[
            OmittedOutput("huge", "too_large", 10, 5, "over"),
            OmittedOutput("odd", "not_a_file"),
        ],
    )


@settings(max_examples=100, deadline=None)
@given(result=RESULTS)
def test_any_result_reads_back_as_it_was_written(result: r.ExecutionResult) -> None:
    assert same_times(through_the_wire(result, to_proto, result_from_proto), result) == result


def test_a_result_with_nothing_set_reads_back_as_it_was_written() -> None:
    result = r.ExecutionResult(execution_id="", status=r.ExecutionStatus.OK)
    assert through_the_wire(result, to_proto, result_from_proto) == result


@pytest.mark.parametrize("make", [_bare, _full], ids=["bare", "full"])
def test_a_result_reads_back_as_it_was_written(make: object) -> None:
    assert callable(make)
    result = make()
    assert through_the_wire(result, to_proto, result_from_proto) == result


def test_a_status_the_client_does_not_know_is_refused() -> None:
    message = to_proto(_bare())
    message.status = pb.EXECUTION_STATUS_UNSPECIFIED
    with pytest.raises(ValueError, match="'unspecified' is not a valid ExecutionStatus"):
        result_from_proto(message)
    message.status = 99  # type: ignore[assignment]  # a newer server's
    with pytest.raises(ValueError, match="has no name defined for value 99"):
        result_from_proto(message)


def test_limits_read_from_a_request() -> None:
    assert limits_from_proto(pb.Limits()) == Limits()
    assert limits_from_proto(pb.Limits(wall_time_ms=1500, open_files=32)) == Limits(
        wall_time_ms=1500, open_files=32
    )
    with pytest.raises(InvalidArgument, match=r"^limits\.memory_bytes: must be positive"):
        limits_from_proto(pb.Limits(memory_bytes=0))


def test_a_time_outside_the_timestamps_range_is_refused_as_before() -> None:
    result = _bare()
    result.finished_at = 253_402_300_800.0  # the year 10000
    with pytest.raises(ValueError, match="Timestamp is not valid"):
        to_proto(result)
    result.finished_at = 253_402_300_799.5  # the last second of the year 9999
    assert to_proto(result).finished_at.seconds == 253_402_300_799
