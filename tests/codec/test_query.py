"""A list query crosses the wire whole: `query_to_proto` then `query_from_proto` gives back the
same `ExecutionQuery`, for none and for any drawn below (a record still running asked for with
the ``running`` flag); the client refuses a status it does not know, the server a bad field,
each with a message naming it, exactly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox._proto import sandbox_pb2 as pb
from sandbox.codec.query import query_from_proto, query_to_proto
from sandbox.errors import InvalidArgument
from sandbox.records import RUNNING, ExecutionQuery
from sandbox.result import ExecutionStatus
from tests.codec.values import names, refusal, same_times, through_the_wire

# Whole milliseconds since the epoch, up to the year 2096.
_TIMES = st.none() | st.integers(0, 4_000_000_000_000).map(lambda ms: ms / 1000)


@st.composite
def queries(draw: st.DrawFn) -> ExecutionQuery:
    since, until = draw(_TIMES), draw(_TIMES)
    if since is not None and until is not None and until < since:
        since, until = until, since
    return ExecutionQuery(
        since=since,
        until=until,
        status=draw(st.none() | st.sampled_from([*ExecutionStatus, RUNNING])),
        tool=draw(st.none() | names),
        violation=draw(st.sampled_from([None, "wall_time", "memory", "protocol"])),
        page_size=draw(st.none() | st.integers(1, 1000)),
        page_token=draw(st.sampled_from(["", "abc"])),
        session_id=draw(st.sampled_from(["", "s-" + "a1" * 16])),
    )


def _round_trip(query: ExecutionQuery) -> ExecutionQuery:
    return through_the_wire(query, query_to_proto, query_from_proto)


@settings(max_examples=100, deadline=None)
@given(query=queries())
def test_any_query_reads_back_as_it_was_written(query: ExecutionQuery) -> None:
    assert same_times(_round_trip(query), query, ("since", "until")) == query


def test_no_query_is_the_empty_one() -> None:
    assert query_to_proto(None) == pb.ListExecutionsRequest()
    assert _round_trip(ExecutionQuery()) == ExecutionQuery()


def test_the_client_refuses_a_status_it_does_not_know() -> None:
    with pytest.raises(InvalidArgument) as refused:
        query_to_proto(ExecutionQuery(status="done"))
    assert str(refused.value) == (
        "status: unknown status 'done' (known: ok, error, limit_exceeded, rejected, cancelled,"
        " interrupted, failed, running)"
    )


# Each bad field, by name: the message the server reads and its exact refusal.
REFUSALS: dict[str, tuple[pb.ListExecutionsRequest, str]] = {
    "page-size": (pb.ListExecutionsRequest(page_size=1001), "page_size: at most 1000, got 1001"),
    "status": (pb.ListExecutionsRequest(status=42), "status: unknown value 42"),  # type: ignore[arg-type]
    "running-and-status": (
        pb.ListExecutionsRequest(status=pb.EXECUTION_STATUS_OK, running=True),
        "running: set together with status; ask for one",
    ),
    "range": (
        pb.ListExecutionsRequest(since={"seconds": 20}, until={"seconds": 10}),
        "until: is before since",
    ),
    "nanos": (
        pb.ListExecutionsRequest(since={"seconds": 1, "nanos": -1}),
        "since.nanos: -1 is outside 0 to 999999999",
    ),
    "seconds": (
        pb.ListExecutionsRequest(until={"seconds": 253_402_300_800}),
        "until.seconds: 253402300800 is outside -62135596800 to 253402300799 (years 1 to 9999)",
    ),
    "violation": (
        pb.ListExecutionsRequest(violation="speed"),
        "violation: unknown limit 'speed'",
    ),
    "session-id": (
        pb.ListExecutionsRequest(session_id="s-1"),
        "session_id: 's-1' is not a session id",
    ),
}


@pytest.mark.parametrize(("message", "error"), REFUSALS.values(), ids=REFUSALS.keys())
def test_a_bad_field_is_refused_naming_it(message: pb.ListExecutionsRequest, error: str) -> None:
    assert refusal(query_from_proto, message) == error
