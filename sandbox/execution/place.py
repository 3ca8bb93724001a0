"""Where one prepared execution runs: a fresh single-use sandbox, or the next cell of a session's.

`Engine.run` is the same for both up to two steps, and this is those two steps: `take` the
sandbox (a single-use run acquires one from the backend's warm pool, and gives the wait up when
the caller cancels; a cell has its session's), and `drive` the job in it (to the sandbox's end,
`single_use`; or to the cell's end, `cell`, which may lose the session). The engine picks the
place once, from whether it was given a session, and asks it nothing else. A place is made for
one run, with that run's hooks (its output and its cancel).
"""

from __future__ import annotations

from typing import Protocol

from sandbox.backends.base import Backend, Job, Outcome, SandboxHandle
from sandbox.execution.acquire import acquire_unless_cancelled
from sandbox.execution.broker import Broker
from sandbox.execution.cell import SessionSandbox
from sandbox.execution.hooks import RunHooks
from sandbox.execution.single_use import run_single_use
from sandbox.limits import ResolvedLimits
from sandbox.telemetry.spans import step_span

__all__ = ["Place", "SessionCell", "SingleUse"]


class Place(Protocol):
    """Where a run happens. ``session_id`` is None for a single-use run, the session's id (as
    the request's labels carry it, possibly empty) for a cell."""

    @property
    def session_id(self) -> str | None: ...

    async def take(self) -> SandboxHandle | None:
        """The sandbox the job runs in; None when the run was cancelled before there was one."""
        ...

    async def drive(self, handle: SandboxHandle, job: Job, broker: Broker) -> tuple[Outcome, str]:
        """Runs ``job`` in ``handle``: its outcome, and why the session was lost ("": it was
        not, or there is none)."""
        ...


class SingleUse:
    """A fresh sandbox from ``backend``'s pool, used for this one run and then gone."""

    session_id = None

    def __init__(
        self, backend: Backend, limits: ResolvedLimits, runtime: str | None, hooks: RunHooks
    ) -> None:
        self.backend, self.limits = backend, limits
        self.runtime, self.hooks = runtime, hooks

    async def take(self) -> SandboxHandle | None:
        with step_span("ptc.sandbox.acquire"):
            return await acquire_unless_cancelled(
                self.backend, self.limits, self.runtime, self.hooks.cancel
            )

    async def drive(self, handle: SandboxHandle, job: Job, broker: Broker) -> tuple[Outcome, str]:
        hooks = self.hooks
        return await run_single_use(handle, job, broker, hooks.on_output, hooks.cancel), ""


class SessionCell:
    """The next cell of ``session``'s sandbox, which outlives the run. ``stubs_sha`` is the
    manifest's hash: the stub module is sent again only when it changed since the last cell."""

    def __init__(
        self, session: SessionSandbox, session_id: str, stubs_sha: str, hooks: RunHooks
    ) -> None:
        self.session, self.session_id = session, session_id
        self.stubs_sha, self.hooks = stubs_sha, hooks

    async def take(self) -> SandboxHandle | None:
        return self.session.handle

    async def drive(self, handle: SandboxHandle, job: Job, broker: Broker) -> tuple[Outcome, str]:
        hooks = self.hooks
        cell = await self.session.run(job, broker, self.stubs_sha, hooks.on_output, hooks.cancel)
        return cell.outcome, cell.lost or ""
