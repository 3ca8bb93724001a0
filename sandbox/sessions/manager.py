"""`SessionManager`: the sessions of one server (or embedded engine), their limits and ends.

A session holds one sandbox taken from a backend at `create` and runs the executions sent to it
one at a time, as cells (`sandbox.execution.cell`). Its limits come in two kinds:

* per session, fixed at `create`: memory and processes of the whole sandbox (its cgroup), disk
  (the private tmpfs and RLIMIT_FSIZE, ``file_size``), open files, total CPU (``cpu_time`` of
  the session's limits: the cgroup's whole usage, and RLIMIT_CPU one second looser), the idle
  timeout, the lifetime and the number of executions;
* per execution, from each request: wall time, CPU time (a delta of the sandbox's usage),
  output and tool calls. The request's memory, processes, file size and open files are
  replaced by the session's: one above the session's is reported as an adjustment (action
  ``session``), one below it is refused (a cell cannot tighten its whole sandbox). These rules
  are `sandbox.sessions.cells`'s.

A second execution while one runs is refused with FAILED_PRECONDITION (`SessionBusy`), never
queued: a conversation sends its cells in order, and a queue would hide a client bug behind a
wait. How a session ends, and what later requests for it get:

=====================  ==========================================  =========================
end                    how                                         later requests
=====================  ==========================================  =========================
closed                 CloseSession, or the server draining (an    NOT_FOUND, "session_lost"
                       in-memory store only)
expired                idle timeout, lifetime, max executions      NOT_FOUND, "session_lost"
lost                   the sandbox died: OOM, protocol violation,  FAILED_PRECONDITION,
                       a cell that ignored its interrupt, the      "session_lost"
                       session's CPU budget, an exit; a rebuild
                       that failed (`sandbox.sessions.rebuild`)
=====================  ==========================================  =========================

A draining server whose audit store can move sessions (SQLite, PostgreSQL: `SessionHolding`)
does not close its sessions but hands them over (`release_all`): each record stays open, and the
session's next call on any server sharing the store is `resume`d there, rebuilt from its record
(`sandbox.sessions.rebuild`), as is a session whose server died.

Every message names the session and why it ended. Ended sessions are remembered (up to
`MAX_ENDED` per manager) so that the reason can be given; an id never issued, or another
tenant's, is NOT_FOUND "no session". Each session is one record in the audit store's chain
(admitted at `create`, completed at its end with the reason), and each of its executions is a
record of its own labelled ``ptc.session_id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager

from sandbox.audit.base import AuditStore
from sandbox.engine import Engine, acquire_sandbox
from sandbox.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from sandbox.execution.cell import SessionSandbox
from sandbox.limits import SPEC_BY_FIELD
from sandbox.result import ExecutionResult, ExecutionStatus
from sandbox.sessions.rebuild import RebuildBounds, rebuild
from sandbox.sessions.record import admit_record, complete_record, gone_error
from sandbox.sessions.session import Session, SessionSettings, SessionState, error_text
from sandbox.telemetry import metrics
from stubs_gen import Manifest

__all__ = [
    "MAX_ENDED",
    "Session",
    "SessionBusy",
    "SessionManager",
    "SessionSettings",
    "SessionState",
]

log = logging.getLogger(__name__)

MAX_ENDED = 4096
SWEEP_S = 0.1


class SessionBusy(FailedPrecondition):
    """An execution was sent to a session that is running another one."""


class SessionManager:
    """Owns every open session; `start` begins the sweeper of idle and expired sessions."""

    def __init__(self, engine: Engine, store: AuditStore | None = None) -> None:
        self.engine = engine
        self.store = store
        self._sessions: dict[str, Session] = {}
        self._ended: OrderedDict[str, Session] = OrderedDict()
        self._sweeper: asyncio.Task[None] | None = None
        self._closing = False
        self._creating: dict[str, int] = {}
        self._rebuilding: dict[tuple[str, str], asyncio.Future[Session | None]] = {}
        self._handed_over: set[str] = set()  # by this draining server: retry elsewhere

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_forever())

    async def release_all(self, reason: str) -> None:
        """A draining server lets go of its sessions: where the store can move them
        (`SessionHolding`), each is handed over (its record stays open, marked handed over,
        and its next call on any server rebuilds it: `sandbox.sessions.rebuild`); otherwise
        each ends `closed` with ``reason``, as `close_all`."""
        if self.store is None or not self.store.holds_sessions:
            await self.close_all(reason)
            return
        self._closing = True
        await self._stop_sweeper()
        for session in list(self._sessions.values()):
            await self._hand_over(session)

    async def _hand_over(self, session: Session) -> None:
        reason = "handed over: the server that held it was draining"
        self._handed_over.add(session.id)
        session.state, session.reason = SessionState.CLOSED, reason
        session.ended_at = time.time()
        self._sessions.pop(session.id, None)
        metrics.active_sessions(len(self._sessions))
        self._remember(session)
        try:
            await session.sandbox.dispose()
        finally:
            try:
                await asyncio.to_thread(self.store.hand_over, session.id, reason)  # type: ignore[union-attr]
            except Exception:  # its record stays running: the sweep after our lease finds it
                log.exception("session %s could not be handed over", session.id)

    async def _stop_sweeper(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None

    async def close_all(self, reason: str) -> None:
        """Ends every open session (a draining or stopping server) and stops the sweeper."""
        self._closing = True
        await self._stop_sweeper()
        for session in list(self._sessions.values()):
            await self._end(session, SessionState.CLOSED, reason, ExecutionStatus.INTERRUPTED)

    # -- requests ------------------------------------------------------------------------------
    async def create(
        self,
        tenant: str,
        *,
        manifest: Manifest,
        manifest_json: str,
        backend: str,
        settings: SessionSettings,
        labels: Mapping[str, str] | None = None,
        max_sessions: int | None = None,
        runtime: str | None = None,
    ) -> Session:
        if self._closing:
            raise FailedPrecondition("sessions: the server is stopping; no new sessions")
        # Sessions still being created count too: concurrent creates cannot pass the maximum.
        open_now = sum(1 for s in self._sessions.values() if s.tenant == tenant)
        open_now += self._creating.get(tenant, 0)
        if max_sessions is not None and open_now >= max_sessions:
            raise ResourceExhausted(
                f"sessions: tenant {tenant!r} has {open_now} open sessions, its maximum; close "
                "one first"
            )
        self._creating[tenant] = self._creating.get(tenant, 0) + 1
        try:
            handle = await acquire_sandbox(self.engine.backend(backend), settings.limits, runtime)
            try:
                await handle.apply_limits(settings.limits)
            except BaseException:
                await handle.dispose()
                raise
        finally:
            self._creating[tenant] -= 1
        if self._closing:  # the server began stopping while the sandbox was being taken
            await handle.dispose()
            raise FailedPrecondition("sessions: the server is stopping; no new sessions")
        session = Session(
            id=f"s-{uuid.uuid4().hex}",
            tenant=tenant,
            backend=backend,
            manifest=manifest,
            manifest_json=manifest_json,
            settings=settings,
            labels=dict(labels or {}),
            sandbox=SessionSandbox(handle, settings.limits.cpu_time_ms),
            runtime=runtime,
        )
        try:
            admit_record(self.store, session)  # a store that refuses it: no session runs unrecorded
        except BaseException:
            await handle.dispose()
            raise
        self._sessions[session.id] = session
        metrics.active_sessions(len(self._sessions))
        return session

    def holds(self, session_id: str) -> bool:
        """True for a session this manager holds, open or ended (any tenant's)."""
        return session_id in self._sessions or session_id in self._ended

    def get(self, tenant: str, session_id: str) -> Session:
        """The tenant's session, open or ended; NOT_FOUND for an unknown or foreign id."""
        if not session_id:
            raise InvalidArgument("session_id: is empty")
        session = self._sessions.get(session_id) or self._ended.get(session_id)
        if session is None or session.tenant != tenant:
            raise self._unknown(tenant, session_id)
        return session

    async def resume(
        self,
        tenant: str,
        session_id: str,
        bounds: RebuildBounds,
        admit: Callable[[], AbstractAsyncContextManager[None]] | None = None,
    ) -> Session:
        """`usable`, except that a session this server does not hold, whose holder is gone
        (dead or drained), is rebuilt here first (`sandbox.sessions.rebuild`), or ends `lost`
        saying why; concurrent calls for the same session wait for the one rebuild. ``admit``
        is the tenant's admission, held while rebuilding (a rebuild runs the tenant's code)."""
        if not session_id:
            raise InvalidArgument("session_id: is empty")
        known = self._sessions.get(session_id) or self._ended.get(session_id)
        if known is not None and known.tenant == tenant and session_id in self._handed_over:
            raise Unavailable(
                f"sessions: this server is stopping and handed session {session_id!r} over; "
                "retry on another server, which rebuilds it"
            )
        if known is not None or self._closing:
            return self.usable(tenant, session_id)
        key = (tenant, session_id)
        pending = self._rebuilding.get(key)
        if pending is None:
            pending = asyncio.ensure_future(rebuild(self, tenant, session_id, bounds, admit))
            self._rebuilding[key] = pending
            pending.add_done_callback(lambda _: self._rebuilding.pop(key, None))
        rebuilt = await asyncio.shield(pending)
        if rebuilt is None:
            raise self._unknown(tenant, session_id)
        return self.usable(tenant, session_id)

    def adopt(self, session: Session) -> None:
        """A session rebuilt here joins this server's open sessions."""
        self._sessions[session.id] = session
        metrics.active_sessions(len(self._sessions))
        self.start()

    def adopt_ended(self, session: Session, state: SessionState, reason: str) -> None:
        """A session whose rebuild failed: remembered as ended, so its calls say why."""
        session.state, session.reason = state, reason
        session.ended_at = time.time()
        self._remember(session)

    async def end_adopted(self, session: Session, status: ExecutionStatus) -> None:
        """Disposes the sandbox of a session `adopt_ended` and completes its record."""
        usage = session.sandbox.handle.usage()
        try:
            await session.sandbox.dispose()
        finally:
            complete_record(self.store, session, status, usage.cpu_time_s, usage.peak_memory_bytes)

    def _remember(self, session: Session) -> None:
        self._ended[session.id] = session
        while len(self._ended) > MAX_ENDED:
            self._ended.popitem(last=False)

    def _unknown(self, tenant: str, session_id: str) -> NotFound:
        return gone_error(self.store, tenant, session_id)

    def usable(self, tenant: str, session_id: str) -> Session:
        """The tenant's open session, or the error that says why it is not."""
        session = self.get(tenant, session_id)
        if not session.active:
            raise session.gone_error()
        return session

    def list(self, tenant: str, *, include_ended: bool = False) -> list[Session]:
        found = [s for s in self._sessions.values() if s.tenant == tenant]
        if include_ended:
            found += [s for s in self._ended.values() if s.tenant == tenant]
        return sorted(found, key=lambda s: s.created_at, reverse=True)

    async def close(self, tenant: str, session_id: str) -> Session:
        session = self.usable(tenant, session_id)
        await self._end(session, SessionState.CLOSED, "closed by the client", ExecutionStatus.OK)
        return session

    def claim(self, session: Session, execution_id: str) -> None:
        """Marks ``session`` busy with ``execution_id``; refuses a second one (never queues)."""
        if not session.active:
            raise session.gone_error()
        if session.running is not None:
            raise SessionBusy(
                f"session_id: session {session.id!r} is running execution "
                f"{session.running!r}; a session runs one execution at a time (refused, not "
                "queued)"
            )
        session.running = execution_id

    async def run_cell(
        self,
        session: Session,
        execution_id: str,
        manifest: Manifest | None,
        run: Callable[[Callable[[], None]], Awaitable[ExecutionResult]],
    ) -> ExecutionResult:
        """Runs one cell of ``session`` (claimed for ``execution_id``) with ``run``, which calls
        the function it is given once the cell's admission is durable (`Recorder.run`'s
        ``on_admitted``). What the session then becomes depends on that point: a cell refused
        before it (the tenant's rate, concurrency or queue, the audit store unavailable, a key
        admitted elsewhere, a caller gone while queued) never touched the sandbox, and the
        session is released as it was (`refused`); after it, the cell's result or error decides
        (`finish`). Every path that runs cells (the server's, the embedded SDK's) comes here."""
        admitted = False

        def mark_admitted() -> None:
            nonlocal admitted
            admitted = True

        try:
            result = await run(mark_admitted)
        except BaseException as exc:
            if admitted:
                await self.finish(session, execution_id, None, manifest, error=exc)
            else:
                await self.refused(session, execution_id)
            raise
        if admitted:
            await self.finish(session, execution_id, result, manifest)
        else:
            await self.refused(session, execution_id)
        return result

    async def refused(self, session: Session, execution_id: str) -> None:
        """Releases ``session`` after a cell that was refused before it was admitted (the
        tenant's rate, concurrency or queue, the audit store unavailable, its caller gone while
        it queued): nothing ran in the sandbox, so nothing of the session changes (its cells,
        its idle clock) and its next cell continues with its state. The refusal is that call's
        error alone. Only a limit of the session that fell while the cell waited (its lifetime,
        `_sweep`) ends it, with that limit's reason."""
        if session.running == execution_id:
            session.running = None
        if session.active and session._doom is not None:
            await self._end(session, SessionState.EXPIRED, session._doom, ExecutionStatus.OK)

    async def finish(
        self,
        session: Session,
        execution_id: str,
        result: ExecutionResult | None,
        manifest: Manifest | None = None,
        *,
        error: BaseException | None = None,
    ) -> None:
        """Releases ``session`` after an admitted execution; ends it when its sandbox is gone
        (``result.session_lost``, a session limit), or when the run raised ``error`` instead
        of giving a result (the sandbox's state is then unknown, so it is not reused). The
        reason names the cell and what ended it."""
        session.running = None
        session.executions.append(execution_id)
        session.last_used_at = time.time()
        session._used_mono = time.monotonic()
        if result is not None:
            session.tool_calls += len(result.calls)
            if manifest is not None:
                session.manifest = manifest
        lost = result.session_lost if result is not None else ""
        if not session.active:
            return
        if session._doom is not None:
            lost = session._doom
            if result is not None:
                result.session_lost = lost
        cell = f"cell {len(session.executions)} (execution id {execution_id})"
        if lost or not session.sandbox.alive:
            reason = lost or "the sandbox ended"
            expired = reason.startswith(("lifetime", "idle"))
            state = SessionState.EXPIRED if expired else SessionState.LOST
            await self._end(session, state, f"{cell}: {reason}", ExecutionStatus.LIMIT_EXCEEDED)
        elif result is None:
            why = error_text(error)
            await self._end(
                session,
                SessionState.LOST,
                f"{cell}: failed after it was admitted, so the state of its sandbox is unknown: "
                f"{why}",
                ExecutionStatus.FAILED,
            )
        elif session.settings.max_executions and (
            len(session.executions) >= session.settings.max_executions
        ):
            await self._end(
                session,
                SessionState.EXPIRED,
                f"max_executions: ran its {session.settings.max_executions} executions",
                ExecutionStatus.OK,
            )

    # -- ends ----------------------------------------------------------------------------------
    async def _end(
        self, session: Session, state: SessionState, reason: str, status: ExecutionStatus
    ) -> None:
        if not session.active:
            return
        session.state, session.reason = state, reason
        session.ended_at = time.time()
        self._sessions.pop(session.id, None)
        metrics.active_sessions(len(self._sessions))
        self._remember(session)
        usage = session.sandbox.handle.usage()
        try:
            await session.sandbox.dispose()
        finally:
            complete_record(self.store, session, status, usage.cpu_time_s, usage.peak_memory_bytes)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                await self._sweep()
            except Exception:  # a bug here must not stop the expiry of other sessions
                log.exception("the session sweeper failed")

    async def _sweep(self) -> None:
        now = time.monotonic()
        for session in list(self._sessions.values()):
            settings = session.settings
            lifetime = now - session._created_mono
            if lifetime >= settings.max_lifetime_s:
                reason = f"lifetime: reached its maximum lifetime of {settings.max_lifetime_s:g} s"
                if session.running is not None:
                    # Killed under the running execution, which reports the session's end.
                    session._doom = reason
                    await session.sandbox.handle.kill()
                    continue
                await self._end(session, SessionState.EXPIRED, reason, ExecutionStatus.OK)
            elif (
                session.running is None
                and session.sandbox.alive
                and session.sandbox.handle.usage().cpu_time_s >= session.sandbox.total_cpu_s
            ):
                # Threads a cell left running spend the budget between executions too.
                reason = (
                    "cpu_time: the session used its total CPU budget of "
                    f"{session.sandbox.total_cpu_s:g} s between executions"
                )
                await self._end(session, SessionState.LOST, reason, ExecutionStatus.LIMIT_EXCEEDED)
            elif session.running is None and not session.sandbox.alive:
                usage = session.sandbox.handle.usage()
                limit = SPEC_BY_FIELD["memory_bytes"].describe(settings.limits.memory_bytes)
                why = (
                    f"memory: the sandbox ran out of memory (its limit of {limit})"
                    if usage.oom_killed
                    else "exited"
                )
                await self._end(
                    session, SessionState.LOST, f"{why} while idle", ExecutionStatus.FAILED
                )
            elif session.running is None and now - session._used_mono >= settings.idle_timeout_s:
                reason = f"idle: no execution for {settings.idle_timeout_s:g} s"
                await self._end(session, SessionState.EXPIRED, reason, ExecutionStatus.OK)


def check_allowed(allowed: bool, tenant: str) -> None:
    if not allowed:
        raise PermissionDenied(f"sessions: tenant {tenant!r} may not open sessions")
