"""A session's state crosses the wire whole: `session_to_proto` then `session_from_proto` gives
back the same `SessionInfo`, for one with nothing set (no end time: None) and any drawn below."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.codec.session import session_from_proto, session_to_proto
from sandbox.records import SessionInfo, SessionState
from tests.codec.values import names, same_times, texts, through_the_wire, times

SESSIONS = st.builds(
    SessionInfo,
    session_id=texts,
    state=st.sampled_from(SessionState),
    end_reason=texts,
    backend=st.sampled_from(["process", "docker", "gvisor", "unspecified"]),
    limits=st.dictionaries(
        st.sampled_from(["cpu_time_ms", "memory_bytes", "processes", "open_files"]),
        st.integers(0, 2**64 - 1),
    ),
    idle_timeout_ms=st.integers(0, 2**64 - 1),
    max_lifetime_ms=st.integers(0, 2**64 - 1),
    max_executions=st.integers(0, 2**64 - 1),
    execution_ids=st.lists(names, max_size=3),
    running_execution_id=texts,
    created_at=times,
    last_used_at=times,
    ended_at=st.none() | times,
    isolation=st.lists(texts, max_size=3),
    runtime=texts,
)
_TIMES = ("created_at", "last_used_at", "ended_at")


@settings(max_examples=100, deadline=None)
@given(info=SESSIONS)
def test_any_session_reads_back_as_it_was_written(info: SessionInfo) -> None:
    back = through_the_wire(info, session_to_proto, session_from_proto)
    assert same_times(back, info, _TIMES) == info


def test_a_session_with_nothing_set_reads_back_as_it_was_written() -> None:
    # No backend on the wire reads as "unspecified", as for a result.
    info = SessionInfo("", SessionState.UNSPECIFIED, backend="unspecified")
    assert not session_to_proto(info).HasField("ended_at")
    assert through_the_wire(info, session_to_proto, session_from_proto) == info
