"""A session's sandbox: one long-lived sandbox that runs a session's executions as cells.

Each cell goes through the one drive loop (`sandbox.execution.drive`) with the cell's rules
(`CellRules`): it ends with the guest's `end` frame, stops by interrupt first, and sends the
rlimits and the stubs only when the sandbox has not had them yet. The session manager
(`sandbox.sessions.manager`) owns the session's lifecycle; this owns its sandbox.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sandbox.backends.base import Job, Outcome, SandboxHandle
from sandbox.capture import OutputCallback
from sandbox.execution.broker import Broker
from sandbox.execution.drive import INTERRUPT_GRACE_S, CellRules, Drive

__all__ = ["INTERRUPT_GRACE_S", "CellOutcome", "SessionSandbox"]


@dataclass
class CellOutcome:
    outcome: Outcome
    lost: str | None  # why the session's sandbox is gone, when it is


class SessionSandbox:
    """A sandbox taken from a backend for a session; runs its cells one at a time."""

    def __init__(self, handle: SandboxHandle, total_cpu_ms: int) -> None:
        self.handle = handle
        self.total_cpu_s = total_cpu_ms / 1000
        self.started = False  # the first job (which applies the rlimits) has been sent
        self.stubs_sha: str | None = None

    @property
    def isolation(self) -> list[str]:
        return list(self.handle.isolation)

    @property
    def alive(self) -> bool:
        return self.handle.alive

    async def run(
        self,
        job: Job,
        broker: Broker,
        stubs_sha: str,
        on_output: OutputCallback | None = None,
        cancel: asyncio.Event | None = None,
    ) -> CellOutcome:
        def sent() -> None:
            self.started = True
            self.stubs_sha = stubs_sha

        rules = CellRules(
            total_cpu_s=self.total_cpu_s,
            rlimits_sent=self.started,
            stubs_sent=self.started and self.stubs_sha == stubs_sha,
            on_sent=sent,
        )
        drive = Drive(self.handle, job, broker, on_output, cancel or asyncio.Event(), rules)
        outcome = await drive.run()
        return CellOutcome(outcome, drive.lost)

    async def dispose(self) -> None:
        await self.handle.dispose()
