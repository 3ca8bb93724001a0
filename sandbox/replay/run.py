"""The replay flow over an engine and an audit store: load, check, run (recorded), compare.

The gRPC server runs the same steps through its `Runner` (`sandbox.server.replay`), with the
tenant's ceilings and admission; `ptc replay` and embedded callers use `replay` here.
"""

from __future__ import annotations

from sandbox.audit.base import AuditRecord, AuditStore
from sandbox.engine import Engine, RunHooks
from sandbox.errors import NotFound
from sandbox.limits import Limits
from sandbox.recording import Recorder
from sandbox.replay.compare import compare
from sandbox.replay.dispatch import ReplayDispatch
from sandbox.replay.source import Recording, recording_from
from sandbox.replay_report import ReplayReport
from sandbox.result import ExecutionResult

__all__ = ["find_record", "replay", "report"]


def find_record(store: AuditStore, execution_id: str, tenant: str | None) -> AuditRecord:
    """The record of ``execution_id`` (of ``tenant`` when given, else of any tenant: the
    operator's view); `NotFound` when there is none."""
    if not execution_id:
        raise NotFound("execution_id: is empty")
    record = store.get(tenant, execution_id) if tenant is not None else store.find(execution_id)
    if record is None:
        raise NotFound(f"execution_id: no execution {execution_id!r}")
    return record


async def replay(
    engine: Engine,
    store: AuditStore,
    execution_id: str,
    *,
    tenant: str | None = None,
    manifest: str | None = None,
    limits: Limits | None = None,
    backend: str | None = None,
) -> ReplayReport:
    """Replays a recorded execution on ``engine`` (its defaults and ceilings apply) and records
    the replay in ``store`` under the recording's tenant."""
    recording = recording_from(find_record(store, execution_id, tenant))
    prepared = engine.prepare(recording.request(manifest=manifest, limits=limits, backend=backend))
    dispatch = ReplayDispatch(recording.result.calls)
    result = await Recorder(store, tenant=recording.tenant).run(
        engine,
        prepared,
        hooks=RunHooks(handlers=dispatch.handlers(), approver=dispatch.approve),
    )
    return report(recording, dispatch, result)


def report(recording: Recording, dispatch: ReplayDispatch, result: ExecutionResult) -> ReplayReport:
    """The report of a finished replay."""
    return ReplayReport(
        recording.execution_id, result, compare(recording.result, result, dispatch.calls)
    )
