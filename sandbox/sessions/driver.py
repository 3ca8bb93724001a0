"""Drives one execution (one REPL cell) in a session's long-lived sandbox.

`sandbox.backends.session` drives a single-use sandbox to its exit; here the sandbox stays: the
execution ends with the guest's `end` frame, and output already written is read off the pipes
before the execution's capture is closed (the guest flushes before it reports, so every byte of
the cell is in the kernel by then). What differs is how a per-execution limit stops the cell:

* wall time, the execution's CPU time (a delta of the sandbox's cgroup usage) and cancellation
  first send an `interrupt` frame (the guest raises KeyboardInterrupt in the cell); a cell that
  reports its end within `INTERRUPT_GRACE_S` leaves the session usable, and the violation's
  action is ``interrupted``. A cell that does not is killed with the whole sandbox.
* a protocol violation, an OOM kill, the session's total CPU budget, or any exit of the sandbox
  end the session; the reason goes to `CellOutcome.lost`.

The guest's `end` frame is still advisory: a script can forge it (it only cuts its own cell
short). The exit code of a cell that ended in a living sandbox is the guest's report, since no
process exited; everything a violation says still comes from the host or the kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any

from sandbox.backends.base import Job, Outcome, ResourceUsage, SandboxHandle
from sandbox.backends.session import FRAME_OVERHEAD, _Session, job_frame
from sandbox.broker import Broker
from sandbox.capture import OutputCallback
from sandbox.execution import evidence
from sandbox.protocol import GuestCall, GuestEnd, GuestMessage, ProtocolViolation, encode_frame

__all__ = ["INTERRUPT_GRACE_S", "CellOutcome", "SessionSandbox"]

INTERRUPT_GRACE_S = 1.0
DRAIN_GRACE_S = 1.0
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
        cell = _Cell(self, job, broker, on_output, cancel or asyncio.Event(), stubs_sha)
        return await cell.run_cell()

    async def dispose(self) -> None:
        await self.handle.dispose()


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


class _Cell(_Session):
    def __init__(
        self,
        sandbox: SessionSandbox,
        job: Job,
        broker: Broker,
        on_output: OutputCallback | None,
        cancel: asyncio.Event,
        stubs_sha: str,
    ) -> None:
        super().__init__(sandbox.handle, job, broker, on_output, cancel)
        self.sandbox = sandbox
        self.stubs_sha = stubs_sha
        self.ended = asyncio.Event()
        self.interrupted = False
        self.lost: str | None = None
        self.cpu_base = 0.0
        self.usage_base = ResourceUsage()

    def deliver(self, message: GuestMessage | ProtocolViolation) -> None:
        if isinstance(message, ProtocolViolation) and self.lost is None:
            self.lost = f"protocol: {message}"
        super().deliver(message)
        if isinstance(message, GuestEnd) and not self._stopping:
            self.ended.set()

    async def kill(self, reason: str) -> None:
        """Interrupts the cell for a per-execution limit; kills the sandbox otherwise, or when
        the cell does not stop in time."""
        if self.killed_for is not None:
            return
        self.killed_for = reason
        if reason in _INTERRUPTIBLE and self.handle.alive:
            self.interrupted = True
            self.handle.channel.send(encode_frame({"t": "interrupt"}))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ended.wait(), INTERRUPT_GRACE_S)
                return
            self.interrupted = False
            self.lost = self.lost or (
                f"{reason}: the execution did not stop within {INTERRUPT_GRACE_S:g} s of its "
                "interrupt and the sandbox was killed"
            )
        self.lost = self.lost or f"{reason}: the sandbox was killed"
        await self.handle.kill()

    async def watch_cpu(self) -> None:
        if not self.handle.has_cgroup_cpu:
            return
        limit_s = self.job.limits.cpu_time_ms / 1000
        while True:
            await asyncio.sleep(0.05)
            used = self.handle.usage().cpu_time_s
            if used >= self.sandbox.total_cpu_s:
                self.lost = (
                    f"cpu_time: the session used its total CPU budget of "
                    f"{self.sandbox.total_cpu_s:g} s"
                )
                await self.kill("session_cpu_time")
                return
            if used - self.cpu_base >= limit_s:
                await self.kill("cpu_time")
                return

    def _frame(self) -> dict[str, Any]:
        frame = job_frame(self.job, self.handle)
        frame["session"] = True
        if self.sandbox.started:
            del frame["rlimits"]  # applied once, by the first job; they cannot be raised
            if self.sandbox.stubs_sha == self.stubs_sha:
                frame["stubs"] = ""
        else:
            cpu_s = math.ceil(self.sandbox.total_cpu_s)
            frame["rlimits"]["cpu_s"] = cpu_s + 1 if self.handle.has_cgroup_cpu else cpu_s
        return frame

    async def run_cell(self) -> CellOutcome:
        handle, limits = self.handle, self.job.limits
        self.usage_base = handle.usage()
        self.cpu_base = self.usage_base.cpu_time_s
        started = time.monotonic()
        self.broker.start_clock()
        handle.stdout.attach(self.stdout, self.on_output)
        handle.stderr.attach(self.stderr, self.on_output)
        handle.channel.serve(self, self.job.max_call_bytes + FRAME_OVERHEAD)
        handle.channel.send(encode_frame(self._frame()))
        self.sandbox.started = True
        self.sandbox.stubs_sha = self.stubs_sha
        helpers = [
            asyncio.create_task(self.watch_cpu()),
            asyncio.create_task(self.watch_cancel()),
        ]
        exited = asyncio.ensure_future(handle.wait())
        ended = asyncio.ensure_future(self.ended.wait())
        closed = asyncio.ensure_future(handle.channel.wait_closed())
        try:
            done, _ = await asyncio.wait(
                [exited, ended, closed],
                timeout=limits.wall_time_ms / 1000,
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
            # An interrupt or kill in progress (from a watcher) settles one way or the other.
            await asyncio.wait([exited, ended], return_when=asyncio.FIRST_COMPLETED)
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            wall = time.monotonic() - started
            if self.ended.is_set() and handle.alive and self.lost is None:
                handle.stdout.catch_up()
                handle.stderr.catch_up()
                exit_code = self.end.exit_code if self.end is not None else 0
            else:
                if self.lost is None:
                    await handle.kill()
                exit_code = await handle.wait()
                await asyncio.wait(
                    [handle.stdout.closed, handle.stderr.closed], timeout=DRAIN_GRACE_S
                )
        finally:
            self._stopping = True
            handle.channel.serve(_Between(handle), self.job.max_call_bytes + FRAME_OVERHEAD)
            handle.stdout.detach()
            handle.stderr.detach()
            ended.cancel()
            exited.cancel()
            closed.cancel()
            for task in [*helpers, *self._calls.values()]:
                task.cancel()
            await asyncio.gather(*helpers, *self._calls.values(), return_exceptions=True)
        self.broker.finish()
        self.outputs.finish()
        resources = handle.usage()
        alive = handle.alive and self.lost is None
        if not alive and self.lost is None:
            if resources.oom_killed:
                self.lost = "memory: the sandbox ran out of memory and was killed"
            else:
                self.lost = f"exited: the sandbox ended with exit code {exit_code}"
        elif self.lost is not None and resources.oom_killed:
            self.lost = "memory: the sandbox ran out of memory and was killed"
        cell_usage = evidence.cell_share(self.usage_base, resources)
        violations = self._violations(exit_code, wall, cell_usage)
        if self.killed_for == "session_cpu_time":
            violations.append(
                evidence.session_cpu_violation(self.sandbox.total_cpu_s, resources.cpu_time_s)
            )
        if self.interrupted and alive:
            violations = evidence.interrupted(violations, self.killed_for)
        outcome = Outcome(
            exit_code=exit_code,
            end=self.end,
            stdout=self.stdout,
            stderr=self.stderr,
            violations=[*violations, *self.outputs.violations()],
            wall_time_s=wall,
            resources=cell_usage,
            isolation=list(handle.isolation),
            cancelled=self.cancelled,
            protocol_error=self.protocol_error,
            outputs=self.outputs.files,
            omitted_outputs=self.outputs.omitted,
        )
        return CellOutcome(outcome, None if alive else self.lost)
