"""A session's sandbox and its cells: one long-lived sandbox that runs a session's executions.

`SessionSandbox` holds the sandbox (taken from a backend for the session) and runs its cells one
at a time; `CellRun` drives one cell. A cell ends with the guest's `end` frame, not with the
sandbox: output already written is read off the pipes first (the guest flushes before it
reports). Wall time, the cell's CPU time (a delta of the sandbox's cgroup usage) and a cancel
first send an `interrupt` frame; a cell that reports its end within `INTERRUPT_GRACE_S` leaves
the session usable (the violation's action is ``interrupted``), one that does not is killed with
the whole sandbox. A protocol violation, an OOM kill, the session's total CPU budget or any exit
of the sandbox end the session: `CellRun.lost` says why. The exit code of a cell that ended in a
living sandbox is the guest's report, since no process exited. The rlimits (and the stubs) are
sent only when the sandbox has not had them yet. Between cells `_Between` serves the channel.

The session manager (`sandbox.sessions.manager`) owns the session's lifecycle; this owns its
sandbox. The common drive (channel, kill, stop, outcome) is `sandbox.execution.drive.Drive`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandbox.backends.base import Job, Outcome, ResourceUsage, SandboxHandle
from sandbox.capture import OutputCallback
from sandbox.execution import evidence
from sandbox.execution.broker import Broker
from sandbox.execution.drive import (
    CPU_POLL_S,
    DRAIN_GRACE_S,
    FRAME_OVERHEAD,
    Drive,
    rlimit_cpu_s,
)
from sandbox.limits import SPEC_BY_NAME
from sandbox.protocol import GuestCall, GuestMessage, ProtocolViolation, encode_frame
from sandbox.result import Violation

__all__ = ["INTERRUPT_GRACE_S", "CellOutcome", "CellRules", "CellRun", "SessionSandbox"]

INTERRUPT_GRACE_S = 1.0
_INTERRUPTIBLE = ("wall_time", "cpu_time", "cancelled")


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
        # When that first job's frame went (`time.monotonic`): a rebuilt session's first
        # replayed cell starts there (`sandbox.sessions.rebuild.RebuildClock`).
        self.first_job_at: float | None = None

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
            if self.first_job_at is None:
                self.first_job_at = time.monotonic()
            self.started = True
            self.stubs_sha = stubs_sha

        rules = CellRules(
            total_cpu_s=self.total_cpu_s,
            rlimits_sent=self.started,
            stubs_sent=self.started and self.stubs_sha == stubs_sha,
            on_sent=sent,
        )
        cell = CellRun(self.handle, job, broker, on_output, cancel or asyncio.Event(), rules)
        outcome = await cell.run()
        return CellOutcome(outcome, cell.lost)

    async def dispose(self) -> None:
        await self.handle.dispose()


@dataclass(frozen=True)
class CellRules:
    """What the session tells a cell: its total CPU budget, and whether the rlimits (and
    these very stubs) were sent by an earlier cell."""

    total_cpu_s: float  # the session's whole budget
    rlimits_sent: bool  # an earlier cell applied them; they cannot be raised
    stubs_sent: bool  # an earlier cell installed these very stubs
    on_sent: Callable[[], None]  # called once the job frame has gone


class CellRun(Drive):
    """Drives one cell in a session's sandbox to its `end` frame: `run` once, then read
    `lost` (None while the session's sandbox lives)."""

    def __init__(
        self,
        handle: SandboxHandle,
        job: Job,
        broker: Broker,
        on_output: OutputCallback | None,
        cancel: asyncio.Event,
        rules: CellRules,
    ) -> None:
        super().__init__(handle, job, broker, on_output, cancel)
        self.rules = rules
        self.interrupted = False  # stopped by its interrupt, in time
        self.lost: str | None = None  # why the session's sandbox is gone, when it is
        self.usage_base = ResourceUsage()  # the cell's counters start from the session's

    async def run(self) -> Outcome:
        """Runs the cell until its `end` frame, its sandbox's exit or its channel closing."""
        started = await self._start()
        exited = asyncio.ensure_future(self.handle.wait())
        ended = asyncio.ensure_future(self.ended.wait())
        try:
            await self._until_end(exited, ended)
            exit_code, wall = await self._settle(exited, ended, started)
        finally:
            exited.cancel()
            ended.cancel()
            await self._stop()
        return self._outcome(exit_code, wall)

    # -- the start -----------------------------------------------------------------------------
    async def _prepare(self) -> None:
        self.usage_base = self.handle.usage()

    def _frame(self) -> dict[str, Any]:
        frame = super()._frame()
        frame["session"] = True
        if self.rules.rlimits_sent:
            del frame["rlimits"]  # applied once, by the first job; they cannot be raised
            if self.rules.stubs_sent:
                frame["stubs"] = ""
        else:
            frame["rlimits"]["cpu_s"] = rlimit_cpu_s(self.rules.total_cpu_s, self.handle)
        return frame

    def _watch(self) -> None:
        self.rules.on_sent()
        self._helpers = [
            asyncio.ensure_future(self._serve_channel()),
            asyncio.ensure_future(self._watch_cpu()),
            asyncio.ensure_future(self._watch_cancel()),
        ]

    async def _serve_channel(self) -> None:
        """Until the channel closes (an error there is the session lost, seen by
        `_until_end`)."""
        with contextlib.suppress(Exception):
            await self.handle.channel.wait_closed()

    async def _watch_cpu(self) -> None:
        if not self._watched():
            return
        while True:
            await asyncio.sleep(CPU_POLL_S)
            reason = self._spent(self.handle.usage())
            if reason is not None:
                await self.kill(reason)
                return

    async def _watch_cancel(self) -> None:
        if self.cancel is None:
            return
        await self.cancel.wait()
        self.cancelled = True
        await self.kill("cancelled")

    def _protocol_seen(self, violation: ProtocolViolation) -> None:
        if self.lost is None:
            self.lost = f"protocol: {violation}"

    def _cpu_spent(self, used_s: float) -> str | None:
        """The session's total budget first, then the cell's own limit from its start."""
        if used_s >= self.rules.total_cpu_s:
            self.lost = (
                f"cpu_time: the session used its total CPU budget of {self.rules.total_cpu_s:g} s"
            )
            return "session_cpu_time"
        return super()._cpu_spent(used_s - self.usage_base.cpu_time_s)

    # -- the end -------------------------------------------------------------------------------
    async def _until_end(self, exited: asyncio.Future[int], ended: asyncio.Future[Any]) -> None:
        """Waits for the `end` frame, the sandbox's exit or its channel closing; kills it when
        the wall-time limit comes first."""
        closed = self._helpers[0]
        done, _ = await asyncio.wait(
            [exited, ended, closed],
            timeout=self.job.limits.wall_time_ms / 1000,
            return_when=asyncio.FIRST_COMPLETED,
        )
        if not done:
            await self.kill("wall_time")
        elif closed in done and not self.ended.is_set():
            # The guest closed or broke its channel: no further cell could be sent. (An
            # exiting sandbox closes it too, a moment before its exit is seen.)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(exited), DRAIN_GRACE_S)
            if not exited.done():
                self.lost = self.lost or "protocol: the sandbox closed its tool channel"
                await self.kill("protocol_closed")

    async def _settle(
        self, exited: asyncio.Future[int], ended: asyncio.Future[Any], started: float
    ) -> tuple[int, float]:
        """The cell's exit code and wall time once an interrupt or kill in progress (from a
        watcher) settled one way or the other."""
        handle = self.handle
        await asyncio.wait([exited, ended], return_when=asyncio.FIRST_COMPLETED)
        for task in self._helpers[1:]:
            task.cancel()
        await asyncio.gather(*self._helpers[1:], return_exceptions=True)
        wall = time.monotonic() - started
        if self.ended.is_set() and handle.alive and self.lost is None:
            handle.stdout.catch_up()
            handle.stderr.catch_up()
            return (self.end.exit_code if self.end is not None else 0), wall
        if self.lost is None:
            await handle.kill()
        exit_code = await exited
        # Output written just before the end is still in the pipes: drain, but not forever.
        await asyncio.wait([handle.stdout.closed, handle.stderr.closed], timeout=DRAIN_GRACE_S)
        return exit_code, wall

    # -- stopping ------------------------------------------------------------------------------
    async def _stop_gently(self, reason: str) -> bool:
        """A per-execution limit or a cancel interrupts the cell first; it is killed, with
        the session's sandbox, only when it does not stop in time."""
        if await self._interrupt(reason):
            return True
        self.lost = self.lost or f"{self._named(reason)}: the sandbox was killed"
        return False

    def _named(self, reason: str) -> str:
        """``reason`` with its limit's value when it is a limit (``wall_time (its limit of
        2 s)``): a session lost to it says which limit, at what value, ended it."""
        spec = SPEC_BY_NAME.get(reason)
        if spec is None:
            return reason
        return f"{reason} (its limit of {spec.describe(getattr(self.job.limits, spec.field))})"

    async def _interrupt(self, reason: str) -> bool:
        """Whether the cell stopped within the grace of an `interrupt` frame."""
        if reason not in _INTERRUPTIBLE or not self.handle.alive:
            return False
        self.interrupted = True
        self.handle.channel.send(encode_frame({"t": "interrupt"}))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.ended.wait(), INTERRUPT_GRACE_S)
            return True
        self.interrupted = False
        self.lost = self.lost or (
            f"{self._named(reason)}: the execution did not stop within "
            f"{INTERRUPT_GRACE_S:g} s of its interrupt and the sandbox was killed"
        )
        return False

    async def _release(self) -> None:
        """The sandbox stays: serve the channel until the next cell."""
        self.handle.channel.serve(_Between(self.handle), self.job.max_call_bytes + FRAME_OVERHEAD)

    # -- the outcome ---------------------------------------------------------------------------
    def _violations(
        self, exit_code: int, wall: float, resources: ResourceUsage
    ) -> tuple[ResourceUsage, list[Violation]]:
        """The cell's share of the sandbox's usage, its violations, and why its session is
        lost (`lost`, None while it lives)."""
        share = evidence.cell_share(self.usage_base, resources)
        alive = self.handle.alive and self.lost is None
        if alive:
            self.lost = None
        elif resources.oom_killed:
            limit = SPEC_BY_NAME["memory"].describe(self.job.limits.memory_bytes)
            self.lost = (
                f"memory: the sandbox ran out of memory (its limit of {limit}) and was killed"
            )
        else:
            self.lost = self.lost or f"exited: the sandbox ended with exit code {exit_code}"
        found = evidence.violations(self._observations(exit_code, wall, share))
        if self.killed_for == "session_cpu_time":
            found.append(
                evidence.session_cpu_violation(self.rules.total_cpu_s, resources.cpu_time_s)
            )
        if self.interrupted and alive:
            found = evidence.interrupted(found, self.killed_for)
        return share, found


class _Between:
    """Serves the channel between a session's executions: a call a leftover thread of the
    last cell makes is refused (nothing may reach a finished execution's call log), an `end`
    frame is ignored, and a protocol violation kills the sandbox (the session is then lost)."""

    def __init__(self, handle: SandboxHandle) -> None:
        self.handle = handle
        self.killing: asyncio.Task[None] | None = None

    def inline(self, call: GuestCall) -> bytes | None:
        return encode_frame(
            {
                "t": "result",
                "id": call.id,
                "ok": False,
                "kind": "refused",
                "message": "no execution is running in this session",
            }
        )

    def deliver(self, message: GuestMessage | ProtocolViolation) -> None:
        if isinstance(message, ProtocolViolation) and self.killing is None:
            self.killing = asyncio.ensure_future(self.handle.kill())
