"""Rebuilding a session on another server: its recorded cells replayed, each one checked.

When the server that held a session is gone (its fleet lease expired, or it handed the session
over while draining), the session's next call on any server of the fleet reaches the manager's
miss path, which comes here (`SessionManager.resume`). The steps:

1. **Claim.** The session's record is taken over in the store (`SessionHolding.take_over`): a
   compare-and-set on the record's holder under the tenant's chain lock, so exactly one server
   rebuilds it; the take-over is an entry of the chain naming both servers. A record that is
   ended, or held by a live server (whose calls are forwarded there, not rebuilt), is not taken.
2. **A fresh sandbox** with the session's settings, all from its record: id, tenant, backend,
   runtime, manifest, whole-sandbox limits, idle timeout, lifetime (counted from its creation),
   most executions, labels.
3. **Replay.** Every recorded cell of the session, in admission order, runs again in that
   sandbox with its recorded script, manifest and limits; every tool call is answered from the
   cell's record (`sandbox.replay.dispatch`), so no tool runs again. The replayed cells are not
   new records: the session's record continues, with its count of executions.
4. **Verify.** Each replayed cell must reproduce its record exactly: status, exit code, error,
   stdout, stderr, violations, its call log, the digests of the files it wrote under
   ``outputs/`` and the value of its last expression (`first_difference`). The first cell that
   differs (it read the clock, drew random numbers, or read a file whose content is not
   reproducible) makes the session `lost`, naming that cell and how it differed; a session is
   never continued with state other than what its user saw.

What cannot be rebuilt, and is `lost` saying so: a cell with no recorded outcome (it was running
when its server died); a cell that was interrupted or cancelled part way; a cell given input
files (the record keeps their names, sizes and hashes, never their bytes); a record a replay
cannot use (`sandbox.replay.source`). Bounds, per tenant (`RebuildBounds`): at most
``session_rebuild_max_cells`` cells and ``session_rebuild_max_cpu_s`` CPU seconds (the
sandbox's whole usage); above either the session is `lost` naming the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import Any, Protocol

from sandbox.audit.base import Admission, AuditQuery, AuditRecord, AuditStore
from sandbox.engine import Engine, RunHooks, acquire_sandbox
from sandbox.errors import FailedPrecondition, PtcError, ResourceExhausted, Unavailable
from sandbox.execution.cell import SessionSandbox
from sandbox.limits import Limits, ResolvedLimits
from sandbox.replay.compare import compare
from sandbox.replay.dispatch import RecordedCalls, ReplayDispatch
from sandbox.replay.source import Recording, recording_from
from sandbox.request_caps import (
    IDLE_TIMEOUT_LABEL,
    KIND_LABEL,
    MAX_EXECUTIONS_LABEL,
    MAX_LIFETIME_LABEL,
    SESSION_LABEL,
)
from sandbox.result import ExecutionResult, ExecutionStatus
from sandbox.sessions.cells import cell_limits
from sandbox.sessions.session import (
    RebuildClock,
    Session,
    SessionSettings,
    SessionState,
    error_text,
)
from sandbox.telemetry import metrics


class SessionHost(Protocol):
    """What a rebuild needs of the manager that will hold the session (`SessionManager`)."""

    engine: Engine
    store: AuditStore | None

    def adopt(self, session: Session) -> None: ...

    def adopt_ended(self, session: Session, state: SessionState, reason: str) -> None: ...

    async def end_adopted(self, session: Session, status: ExecutionStatus) -> None: ...


__all__ = ["RebuildBounds", "SessionHost", "first_difference", "rebuild"]

log = logging.getLogger(__name__)

# The labels a session's record adds to its own (`SessionManager._admit`); the rest are the
# client's labels, given back to the rebuilt session.
_SETTING_LABELS = (KIND_LABEL, IDLE_TIMEOUT_LABEL, MAX_LIFETIME_LABEL, MAX_EXECUTIONS_LABEL)
_PAGE = 500


@dataclass(frozen=True)
class RebuildBounds:
    """The most a rebuild may spend, from the tenant's settings."""

    max_cells: int
    max_cpu_s: float


class _Lost(Exception):
    """The rebuild failed: ``reason`` says which cell or bound, and why."""

    def __init__(self, reason: str, status: ExecutionStatus = ExecutionStatus.FAILED) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


def _what_differs(what: str) -> str:
    if what in ("stdout", "stderr"):
        return "printed different output"
    if what.startswith("calls["):
        return "made different tool calls"
    if what == "value":
        return "ended with a different value"
    return "ended differently"


def first_difference(
    recorded: ExecutionResult, replayed: ExecutionResult, calls: RecordedCalls
) -> str | None:
    """How a replayed cell first differs from its record, as a phrase (``printed different
    output: stdout differs: line 1 was '0.1', is '0.7'``), or None when it reproduces it
    exactly. Compared, in order: status, exit code, error, stdout, stderr, violations, the
    call log (`sandbox.replay.compare`), the files it wrote under ``outputs/`` (name, size and
    sha256: the record keeps no more), then the value of the cell's last expression."""
    differences = compare(recorded, replayed, calls)
    if differences:
        first = differences[0]
        return f"{_what_differs(first.what)}: {first.detail}"
    old_files = [(f.name, f.size, f.sha256) for f in recorded.output_files]
    new_files = [(f.name, f.size, f.sha256) for f in replayed.output_files]
    if old_files != new_files:
        changed = sorted({n for n, *_ in old_files} ^ {n for n, *_ in new_files}) or sorted(
            {n for n, *_ in set(old_files) ^ set(new_files)}
        )
        return f"wrote different output files: {', '.join(map(repr, changed[:5]))} differ"
    if recorded.value != replayed.value:
        return (
            f"{_what_differs('value')}: was {_short(recorded.value)}, is {_short(replayed.value)}"
        )
    return None


def _short(value: str | None) -> str:
    if value is None:
        return "none"
    return repr(value if len(value) <= 200 else value[:197] + "...")


def _cells(store: object, tenant: str, session_id: str, most: int) -> list[AuditRecord]:
    """The session's cells, oldest first; stops reading past ``most`` (one more is enough to
    know the bound is exceeded)."""
    found: list[AuditRecord] = []
    token: str | None = None
    while True:
        page, token = store.list(  # type: ignore[attr-defined]
            tenant, AuditQuery(session_id=session_id, limit=_PAGE, page_token=token)
        )
        found += page
        if token is None or len(found) > most:
            break
    # Newest first from the store: the admission order is the reverse. The query matches the
    # label's text; the label itself is checked here.
    cells = [r for r in reversed(found) if r.admission.labels.get(SESSION_LABEL) == session_id]
    return cells


async def rebuild(
    manager: SessionHost,
    tenant: str,
    session_id: str,
    bounds: RebuildBounds,
    admit: Callable[[], AbstractAsyncContextManager[None]] | None = None,
) -> Session | None:
    """The session ``session_id`` rebuilt on this server (active), or ended `lost` with the
    reason; None when it is not this server's to rebuild (no such open session record, a store
    that cannot move sessions, or a holder that is alive). ``admit`` is the tenant's admission
    (concurrency, queue, rate), entered before the claim and held while the cells replay: a
    rebuild counts as one execution of the tenant's."""
    asked = time.monotonic()
    store = manager.store
    if store is None or not store.holds_sessions:
        return None
    record = await asyncio.to_thread(store.get, tenant, session_id)
    if record is None or record.admission.labels.get(KIND_LABEL) != "session":
        return None
    if record.result is not None:
        return None  # ended: the caller says how
    async with admit() if admit is not None else contextlib.nullcontext():
        return await _claim_and_rebuild(manager, record, bounds, asked)


async def _claim_and_rebuild(
    manager: SessionHost, record: AuditRecord, bounds: RebuildBounds, asked: float
) -> Session | None:
    store: Any = manager.store  # a `SessionHolding` store (checked by `rebuild`)
    tenant, session_id = record.admission.tenant, record.admission.execution_id
    previous = await asyncio.to_thread(store.take_over, tenant, session_id)
    if previous is None:
        return None
    started = time.monotonic()  # the take-over's commit: this server holds the session now
    here = str(store.instance)
    log.warning("sessions: rebuilding session %s (held by %s) on %s", session_id, previous, here)
    clock = RebuildClock(asked=asked, taken_over=started)
    session, cells = await _fresh_session(manager, record, bounds, here, clock)
    session.running = "rebuild"  # not yet in the manager: nothing else can reach it
    try:
        await _replay(manager, session, cells, bounds)
    except _Lost as lost:
        session.running = None
        reason = f"could not be rebuilt on {here}: {lost.reason}"
        manager.adopt_ended(session, SessionState.LOST, reason)
        await manager.end_adopted(session, lost.status)
        metrics.session_rebuilt("lost", time.monotonic() - started)
        log.warning("sessions: session %s lost: %s", session_id, reason)
        return session
    except BaseException as exc:
        session.running = None
        why = f"could not be rebuilt on {here}: {error_text(exc)}"
        manager.adopt_ended(session, SessionState.LOST, why)
        await manager.end_adopted(session, ExecutionStatus.FAILED)
        raise
    session.running = None
    _adopt_rebuilt(manager, session, cells)
    metrics.session_rebuilt("rebuilt", time.monotonic() - started)
    _log_rebuilt(session, here, len(cells), started)
    return session


def _recorded_limits(admission: Admission) -> ResolvedLimits:
    """The limits a session's record says it ran under, which its rebuilt sandbox gets: refused
    when the record keeps them in an older format, or one is under today's minimum (a backend
    could not apply it)."""
    limits = admission.effective_limits
    if limits is None:
        raise FailedPrecondition(
            f"session {admission.execution_id}: its record keeps its limits in an older format"
        )
    Limits.from_mapping(limits.to_fields(), "recorded effective_limits")
    return limits


async def _fresh_session(
    manager: SessionHost, record: AuditRecord, bounds: RebuildBounds, here: str, clock: RebuildClock
) -> tuple[Session, list[AuditRecord]]:
    """Step 2: the session's settings read from its record, its recorded cells (up to one past
    the bound), and a fresh sandbox with those settings. A record that cannot be read, or a
    sandbox that cannot be had, raises what `_not_started` says (the session let go of again)."""
    store: Any = manager.store
    tenant, session_id = record.admission.tenant, record.admission.execution_id
    admission = record.admission
    labels = dict(admission.labels)
    try:
        limits = _recorded_limits(admission)
        settings = SessionSettings(
            limits=limits,
            idle_timeout_s=int(labels[IDLE_TIMEOUT_LABEL]) / 1000,
            max_lifetime_s=int(labels[MAX_LIFETIME_LABEL]) / 1000,
            max_executions=int(labels[MAX_EXECUTIONS_LABEL]),
        )
        cells = await asyncio.to_thread(_cells, store, tenant, session_id, bounds.max_cells)
        manifest_json = admission.manifest_json
        manifest = manager.engine.manifest(manifest_json)
        runtime = admission.runtime or None
        handle = await acquire_sandbox(manager.engine.backend(admission.backend), limits, runtime)
        try:
            await handle.apply_limits(limits)
        except BaseException:
            await handle.dispose()
            raise
    except (PtcError, KeyError, TypeError, ValueError) as exc:
        raise await _not_started(store, session_id, here, exc) from exc
    wall_elapsed = max(0.0, time.time() - admission.admitted_at)
    session = Session(
        id=session_id,
        tenant=tenant,
        backend=admission.backend,
        manifest=manifest,
        manifest_json=manifest_json,
        settings=settings,
        labels={k: v for k, v in labels.items() if k not in _SETTING_LABELS},
        sandbox=SessionSandbox(handle, limits.cpu_time_ms),
        runtime=runtime,
        created_at=admission.admitted_at,
        _created_mono=time.monotonic() - wall_elapsed,  # its lifetime runs from its creation
        rebuilt=clock,
    )
    return session, cells


def _adopt_rebuilt(manager: SessionHost, session: Session, cells: list[AuditRecord]) -> None:
    """The replayed session continues its record: its executions, tool calls and latest
    manifest are the cells', and the manager holds it from now on."""
    session.executions = [c.admission.execution_id for c in cells]
    session.tool_calls = sum(len(c.result.calls) for c in cells if c.result is not None)
    for cell in cells:
        if cell.admission.manifest_json:  # the latest one a cell brought is the session's
            session.manifest = manager.engine.manifest(cell.admission.manifest_json)
    session.last_used_at = time.time()
    session._used_mono = time.monotonic()
    manager.adopt(session)


def _log_rebuilt(session: Session, here: str, cells: int, taken_over: float) -> None:
    first_job = session.sandbox.first_job_at
    log.warning(
        "sessions: session %s rebuilt on %s: %d cells replayed in %.2f s, the first started "
        "%.1f ms after the take-over",
        session.id,
        here,
        cells,
        time.monotonic() - taken_over,
        (first_job - taken_over) * 1000 if first_job is not None else float("nan"),
    )


async def _not_started(store: Any, session_id: str, here: str, exc: Exception) -> PtcError:
    """What a rebuild that could not start raises. Nothing ran: the session is let go of again,
    so that a later call (here or elsewhere) can retry. The store or the backend unable to serve
    now is a refusal of that kind, like any cell's, never a session said lost when nothing of
    it was; a record that cannot be read is FAILED_PRECONDITION."""
    why = exc.message if isinstance(exc, PtcError) else f"its record is malformed: {exc!r}"
    with contextlib.suppress(Exception):
        await asyncio.to_thread(
            store.hand_over, session_id, f"the rebuild on {here} could not start: {why}"
        )
    if isinstance(exc, (Unavailable, ResourceExhausted)):
        return type(exc)(
            f"session_id: session {session_id!r} could not be rebuilt on {here} now: {why}; "
            "it is left as it was, and its next cell rebuilds it"
        )
    return FailedPrecondition(
        f"session_lost: session {session_id!r} could not be rebuilt on {here} now: {why}"
    )


async def _replay(
    manager: SessionHost,
    session: Session,
    cells: list[AuditRecord],
    bounds: RebuildBounds,
) -> None:
    """Replays ``cells`` into ``session``'s sandbox; raises `_Lost` at the first that cannot be
    replayed, exceeds a bound or differs."""
    if len(cells) > bounds.max_cells:
        raise _Lost(
            f"session_rebuild_max_cells: it has more recorded cells than the tenant's bound "
            f"of {bounds.max_cells} cells a rebuild may replay",
            ExecutionStatus.LIMIT_EXCEEDED,
        )
    sandbox = session.sandbox
    manifest_json = session.manifest_json  # a cell without its own runs the session's
    for number, record in enumerate(cells, start=1):
        where = f"cell {number} (execution id {record.admission.execution_id})"
        recorded = _recorded_outcome(record, where)
        if record.admission.manifest_json:
            manifest_json = record.admission.manifest_json  # it brought a new one: it stays
        recording = _recording(manager, record, manifest_json, where)
        request = replace(recording.request(), labels={SESSION_LABEL: session.id}, replay_of="")
        limits, _ = manager.engine.effective_limits(recording.limits)
        limits, _ = cell_limits(session, limits)
        spent = sandbox.handle.usage().cpu_time_s
        left_ms = max(1, int((bounds.max_cpu_s - spent) * 1000))
        clamped = left_ms < limits.cpu_time_ms  # the bound, not the cell's own limit, binds
        limits = replace(limits, cpu_time_ms=min(limits.cpu_time_ms, left_ms))
        prepared = manager.engine.prepare(
            request, limits=(limits, ()), execution_id=f"rebuild-{uuid.uuid4().hex}"
        )
        dispatch = ReplayDispatch(recorded.calls)
        replayed = await manager.engine.run(
            prepared,
            hooks=RunHooks(handlers=dispatch.handlers(), approver=dispatch.approve),
            session=sandbox,
            tenant=session.tenant,
        )
        spent = sandbox.handle.usage().cpu_time_s
        hit = clamped and any(v.limit == "cpu_time" for v in replayed.violations)
        if spent >= bounds.max_cpu_s or hit:
            raise _Lost(
                f"session_rebuild_max_cpu_s: replaying {where} reached the tenant's bound of "
                f"{bounds.max_cpu_s:g} CPU seconds for a rebuild ({spent:.2f} s spent)",
                ExecutionStatus.LIMIT_EXCEEDED,
            )
        if replayed.session_lost:
            raise _Lost(f"{where} lost the sandbox when replayed: {replayed.session_lost}")
        differs = first_difference(recorded, replayed, dispatch.calls)
        if differs is not None:
            raise _Lost(f"{where} {differs}")
        if not sandbox.alive:
            raise _Lost(f"{where}: the sandbox ended after it was replayed")


def _recorded_outcome(record: AuditRecord, where: str) -> ExecutionResult:
    """The cell's recorded outcome, or `_Lost` when it is one a replay cannot reproduce: none
    (it was running when its server died), cut short part way, or given input files."""
    recorded = record.result
    if recorded is None:
        raise _Lost(
            f"{where} has no recorded outcome (it is {record.status}): what it did to the "
            "session's state is unknown"
        )
    if recorded.status in (ExecutionStatus.INTERRUPTED, ExecutionStatus.CANCELLED):
        raise _Lost(
            f"{where} was {recorded.status} part way when recorded: how far it got, and so "
            "the session's state after it, cannot be reproduced"
        )
    if recorded.input_files:
        names = ", ".join(repr(f.name) for f in recorded.input_files[:5])
        raise _Lost(
            f"{where} was given input files ({names}); the audit record keeps their names, "
            "sizes and hashes, not their bytes"
        )
    return recorded


def _recording(
    manager: SessionHost, record: AuditRecord, manifest_json: str, where: str
) -> Recording:
    """The cell as a replay runs it, with ``manifest_json`` (its own, or the session's latest
    when it brought none), which must be the manifest its record names by digest."""
    full = replace(record, admission=replace(record.admission, manifest_json=manifest_json))
    if manager.engine.manifest(manifest_json).sha256 != full.admission.manifest_sha256:
        raise _Lost(f"{where} ran with a manifest the record does not hold")
    if full.admission.older_limits is not None:  # a replay would default some: not the cell
        raise _Lost(f"{where}: its record keeps its limits in an older format")
    try:
        return recording_from(full)
    except FailedPrecondition as exc:
        raise _Lost(f"{where}: {exc.message}") from exc
