"""An audit record crosses the wire as the client's `ExecutionRecord`: every field the server's
`AuditRecord` keeps reads back the same, a running record (no result) as `RUNNING` with no
result, an interrupted one as its admission's partial result; a page keeps its order and token."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox._proto import sandbox_pb2 as pb
from sandbox.audit.base import Admission, AuditRecord
from sandbox.codec.record import page_from_proto, record_from_proto, record_to_proto
from sandbox.limits import DEFAULTS
from sandbox.records import RUNNING, ExecutionPage, ExecutionRecord
from sandbox.result import ExecutionResult, ExecutionStatus
from tests.codec.values import (
    RESULTS,
    effective_limits,
    names,
    same_times,
    texts,
    through_the_wire,
    times,
)

ADMISSIONS = st.builds(
    Admission,
    execution_id=texts,
    tenant=texts,
    script=texts,
    manifest_json=st.just("[]"),
    manifest_sha256=texts,
    backend=st.sampled_from(["process", "docker", "gvisor"]),
    policy=st.sampled_from(["none", "restricted"]),
    effective_limits=effective_limits,
    labels=st.dictionaries(names, texts, max_size=2),
    admitted_at=times,
    replay_of=texts,
    runtime=texts,
    idempotency_key=texts,
)


@st.composite
def records(draw: st.DrawFn) -> AuditRecord:
    result = draw(st.none() | RESULTS)
    if result is None:
        status = draw(st.sampled_from(["running", "interrupted"]))
    else:
        status = str(result.status)
    return AuditRecord(
        admission=draw(ADMISSIONS),
        result=result,
        status=status,
        prev_hash=draw(texts),
        record_hash=draw(texts),
        script_sha256=draw(texts),
        interrupted_reason=draw(st.none() | texts),
    )


def _expected(record: AuditRecord) -> ExecutionRecord:
    """What the client is to read: the record's fields, and its result or, interrupted with
    none, what its admission knew."""
    admission = record.admission
    result = record.result
    if result is None and record.status == "interrupted":
        result = ExecutionResult(
            execution_id=admission.execution_id,
            status=ExecutionStatus.INTERRUPTED,
            backend=admission.backend,
            effective_limits=admission.effective_limits,
            started_at=admission.admitted_at,
        )
    return ExecutionRecord(
        execution_id=admission.execution_id if result is None else result.execution_id,
        status=RUNNING if result is None else str(result.status),
        result=result,
        tenant=admission.tenant,
        script=admission.script,
        script_sha256=record.script_sha256,
        manifest_sha256=admission.manifest_sha256,
        prev_hash=record.prev_hash,
        record_hash=record.record_hash,
        labels=dict(admission.labels),
        replay_of=admission.replay_of,
        runtime=admission.runtime,
        idempotency_key=admission.idempotency_key,
        interrupted_reason=record.interrupted_reason or "",
    )


def _read(record: AuditRecord) -> ExecutionRecord:
    back = through_the_wire(record, record_to_proto, record_from_proto)
    expected = _expected(record)
    if back.result is not None and expected.result is not None:
        object.__setattr__(back, "result", same_times(back.result, expected.result))
    return back


@settings(max_examples=50, deadline=None)
@given(record=records())
def test_any_record_reads_back_as_the_server_kept_it(record: AuditRecord) -> None:
    assert _read(record) == _expected(record)


def test_a_running_record_reads_back_running_with_no_result() -> None:
    admission = Admission("e1", "t", "print(1)", "[]", "m", "process", "none", None)
    back = _read(AuditRecord(admission, None, "running", "p", "h", "s"))
    assert (back.execution_id, back.status, back.result) == ("e1", RUNNING, None)


def test_a_page_keeps_its_records_in_order_and_its_token() -> None:
    admissions = [
        Admission(f"e{i}", "t", "", "[]", "", "process", "none", DEFAULTS) for i in range(3)
    ]
    message = pb.ListExecutionsResponse(
        records=[record_to_proto(AuditRecord(a, None, "running", "", "", "")) for a in admissions],
        next_page_token="next",
    )
    page = page_from_proto(message)
    assert isinstance(page, ExecutionPage)
    assert [r.execution_id for r in page.records] == ["e0", "e1", "e2"]
    assert page.next_page_token == "next"
