"""The drive loop: one execution in one sandbox, the same way for every backend.

Sends the job, serves the tool channel through the broker, drains stdout and stderr into capped
buffers, and enforces the host-side limits: the wall-time deadline and the whole-sandbox CPU
budget (polled from the cgroup, since RLIMIT_CPU is per process). It ends one of two ways:

* **exit** (a single-use sandbox, `run_session`): the execution ends when the sandbox exits;
  on any kill the whole sandbox goes (the backend's `kill` takes every process). The exit code
  is always the kernel's, never the guest's report: a script can forge an `end` frame and then
  exit otherwise.
* **end frame** (a session's cell, `CellRules`): the sandbox stays, and the execution ends with
  the guest's `end` frame; output already written is read off the pipes first (the guest
  flushes before it reports). Wall time, the cell's CPU time (a delta of the sandbox's cgroup
  usage) and cancellation first send an `interrupt` frame; a cell that reports its end within
  `INTERRUPT_GRACE_S` leaves the session usable (the violation's action is ``interrupted``),
  one that does not is killed with the whole sandbox. A protocol violation, an OOM kill, the
  session's total CPU budget, or any exit of the sandbox end the session: `Drive.lost` says
  why. The exit code of a cell that ended in a living sandbox is the guest's report, since no
  process exited.

What the host and the kernel observed becomes violations in `sandbox.execution.evidence`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from sandbox.backends.base import Job, Outcome, ResourceUsage, SandboxHandle
from sandbox.capture import CappedOutput, OutputCallback
from sandbox.execution import evidence
from sandbox.execution.broker import Broker
from sandbox.execution.outputs import OutputCollector
from sandbox.limits import SPEC_BY_NAME
from sandbox.protocol import (
    GuestCall,
    GuestEnd,
    GuestHangUp,
    GuestMessage,
    GuestOmit,
    GuestOutput,
    ProtocolViolation,
    encode_frame,
)
from sandbox.result import CallRecord, Violation

__all__ = [
    "CALL_STOP_GRACE_S",
    "INTERRUPT_GRACE_S",
    "CellRules",
    "Drive",
    "block_buffered_output",
    "job_frame",
    "run_session",
]

CPU_POLL_S = 0.05
DRAIN_GRACE_S = 1.0
# How long the stop waits for tool calls and helpers it cancelled before it leaves them.
CALL_STOP_GRACE_S = 2.0
INTERRUPT_GRACE_S = 1.0
FRAME_OVERHEAD = 4096
_INTERRUPTIBLE = ("wall_time", "cpu_time", "cancelled")
log = logging.getLogger(__name__)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


_BLOCK_BUFFERED_OUTPUT: ContextVar[bool] = ContextVar("ptc_block_buffered_output", default=False)


@contextlib.contextmanager
def block_buffered_output() -> Iterator[None]:
    """For bench/output.py only: jobs sent in this context leave the guest's stdout
    block-buffered instead of line-buffered (the benchmark's baseline). A kill then takes what
    the buffer holds, so nothing else may use it."""
    token = _BLOCK_BUFFERED_OUTPUT.set(True)
    try:
        yield
    finally:
        _BLOCK_BUFFERED_OUTPUT.reset(token)


def job_frame(job: Job, handle: SandboxHandle) -> dict[str, Any]:
    """The `job` frame that starts ``job`` in ``handle`` (see `sandbox.protocol`)."""
    limits = job.limits
    rlimits = {
        "cpu_s": _rlimit_cpu_s(limits.cpu_time_ms / 1000, handle),
        "fsize_bytes": limits.file_size_bytes,
        "nofile": limits.open_files,
        "core_bytes": 0,
    }
    if not handle.capabilities.cgroup_pids:
        rlimits["nproc"] = limits.processes
    if not handle.capabilities.cgroup_memory:
        # Only without a memory cgroup: RLIMIT_AS counts reserved address space, and every
        # thread reserves a stack and a malloc arena, so under it a script could start only a
        # few threads long before the memory or processes limit was near.
        rlimits["as_bytes"] = limits.memory_bytes
    frame: dict[str, Any] = {
        "t": "job",
        "script": job.script,
        "stubs": job.stubs,
        "rlimits": rlimits,
        "max_call_bytes": job.max_call_bytes,
        "files": [
            {"name": f.name, "data": base64.b64encode(f.data).decode("ascii")} for f in job.files
        ],
        "outputs": {
            "files": limits.output_files,
            "file_bytes": limits.output_file_bytes,
            "bytes": limits.output_bytes,
            "frame_bytes": job.max_call_bytes,
        },
    }
    if _BLOCK_BUFFERED_OUTPUT.get():
        frame["block_buffered_output"] = True
    return frame


def _rlimit_cpu_s(limit_s: float, handle: SandboxHandle) -> int:
    # The cgroup watchdog is exact for the whole sandbox; RLIMIT_CPU is the per-process
    # backstop, one second looser so that the precise check trips first.
    cpu_s = math.ceil(limit_s)
    return cpu_s + 1 if handle.capabilities.cgroup_cpu else cpu_s


@dataclass(frozen=True)
class CellRules:
    """What a session's cell changes in the drive: it ends with the `end` frame, stops by
    interrupt first, counts its CPU time from its start and the session's total budget, and
    sends the rlimits (and the stubs) only when the sandbox has not had them yet."""

    total_cpu_s: float  # the session's whole budget
    rlimits_sent: bool  # an earlier cell applied them; they cannot be raised
    stubs_sent: bool  # an earlier cell installed these very stubs
    on_sent: Callable[[], None]  # called once the job frame has gone


class Drive:
    """Drives one job in one sandbox to its end: `run` once, then read `lost` for a cell."""

    def __init__(
        self,
        handle: SandboxHandle,
        job: Job,
        broker: Broker,
        on_output: OutputCallback | None,
        cancel: asyncio.Event | None,
        cell: CellRules | None = None,
    ) -> None:
        self.handle, self.job, self.broker, self.cell = handle, job, broker, cell
        self.on_output = on_output
        self.cancel = cancel
        self.stdout = CappedOutput("stdout", job.limits.stdout_bytes)
        self.stderr = CappedOutput("stderr", job.limits.stderr_bytes)
        self.outputs = OutputCollector(job.limits)
        self.end: GuestEnd | None = None
        self.ended = asyncio.Event()  # the `end` frame arrived while the execution ran
        self.protocol_error: str | None = None
        self.killed_for: str | None = None
        self.cancelled = False
        self.interrupted = False  # a cell stopped by its interrupt, in time
        self.lost: str | None = None  # why a cell's session sandbox is gone, when it is
        self.usage_base = ResourceUsage()  # a cell's counters start from the session's
        self._calls: dict[int, asyncio.Task[None]] = {}  # 0: the kill after a violation
        self._waiting: dict[int, CallRecord] = {}  # calls the loop answers, by guest call id
        self._helpers: list[asyncio.Future[Any]] = []
        self._cpu_timer: asyncio.TimerHandle | None = None
        self._stopping = False
        self._single_use_end: _SingleUseEnd | None = None
        self.hung_up = False  # the guest's `bye`: it closed its output and exits next

    # -- the channel (see `sandbox.backends.channel`) ------------------------------------------
    def inline(self, call: GuestCall) -> bytes | None:
        """On the channel thread: records the call and answers it when nothing need wait."""
        if call.id in self._waiting:
            raise ProtocolViolation(f"call id {call.id} is already in flight")
        record, reply = self.broker.receive(call)
        if reply is None:
            self._waiting[call.id] = record
        return reply

    def deliver(self, message: GuestMessage | ProtocolViolation) -> None:
        """On the event loop: what the channel thread could not answer itself."""
        if isinstance(message, ProtocolViolation) and self.lost is None and self.cell is not None:
            self.lost = f"protocol: {message}"
        if self._stopping:
            return
        if isinstance(message, GuestCall):
            # Output the script wrote before this call goes out before the call's request.
            self.handle.stdout.catch_up()
            self.handle.stderr.catch_up()
            self._calls[message.id] = asyncio.create_task(self.reply(message))
        elif isinstance(message, GuestEnd):
            self.end = message
            self.ended.set()
            self._guest_done()
        elif isinstance(message, GuestHangUp):
            self.hung_up = True
            self._guest_done()
        elif isinstance(message, (GuestOutput, GuestOmit)):
            try:
                self.outputs.receive(message)
            except ProtocolViolation as exc:
                self.deliver(exc)
        elif isinstance(message, ProtocolViolation) and self.protocol_error is None:
            self.protocol_error = str(message)
            self._calls[0] = asyncio.create_task(self.kill("protocol"))

    def _guest_done(self) -> None:
        """A single-use guest that reported its end and then hung up has finished: its run
        ends once its output and channel are closed, without waiting for its exit."""
        if self._single_use_end is not None and self.end is not None and self.hung_up:
            self._single_use_end.reported(self.end.exit_code)

    async def reply(self, call: GuestCall) -> None:
        frame = await self.broker.complete(call, self._waiting[call.id])
        # The id is free again before the guest can see the reply.
        del self._waiting[call.id]
        if self._stopping:  # a call abandoned at the stop: a session's next cell must not get it
            return
        self.handle.channel.send(frame)

    # -- stopping ------------------------------------------------------------------------------
    async def kill(self, reason: str) -> None:
        """Kills the sandbox, once; a cell is interrupted first for a per-execution limit, and
        killed only when it does not stop in time."""
        if self.killed_for is not None:
            return
        self.killed_for = reason
        if self.cell is not None:
            if await self._interrupt(reason):
                return
            self.lost = self.lost or f"{self._named(reason)}: the sandbox was killed"
        await self.handle.kill()

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

    async def watch_cpu(self) -> None:
        if not self._watched():
            return
        while True:
            await asyncio.sleep(CPU_POLL_S)
            reason = self._spent(self.handle.usage())
            if reason is not None:
                await self.kill(reason)
                return

    def _watched(self) -> bool:
        """Whether the host polls the sandbox's whole usage: a cgroup's CPU counter, or its
        own sums over the sandbox's processes where no cgroup counts them."""
        capabilities = self.handle.capabilities
        return capabilities.cgroup_cpu or capabilities.host_accounting

    def _spent(self, used: ResourceUsage) -> str | None:
        """The limit the sandbox's usage has reached, if any: CPU time (the cgroup's or the
        host's sum) or, where the host sums it, memory (a cgroup enforces its own)."""
        reason = self._cpu_spent(used.cpu_time_s)
        over = used.host_accounted and used.memory_bytes > self.job.limits.memory_bytes
        return "memory" if reason is None and over else reason

    def _cpu_spent(self, used_s: float) -> str | None:
        """The CPU limit the sandbox's usage has reached, if any."""
        if self.cell is not None:
            if used_s >= self.cell.total_cpu_s:
                self.lost = (
                    f"cpu_time: the session used its total CPU budget of "
                    f"{self.cell.total_cpu_s:g} s"
                )
                return "session_cpu_time"
            used_s -= self.usage_base.cpu_time_s
        return "cpu_time" if used_s >= self.job.limits.cpu_time_ms / 1000 else None

    def _check_cpu(self) -> None:
        """A single-use run's watch, every `CPU_POLL_S`: its CPU limit and a cancel. A timer,
        not a task for each (the loop's bookkeeping for a task per execution is host CPU
        every execution pays, `bench.forkserver`); a cancel is therefore seen within
        `CPU_POLL_S`, not at once."""
        self._cpu_timer = None
        if self._stopping:
            return
        reason: str | None = None
        if self.cancel is not None and self.cancel.is_set():
            self.cancelled = True
            reason = "cancelled"
        elif self._watched():
            reason = self._spent(self.handle.usage())
        if reason is None:
            self._cpu_timer = asyncio.get_running_loop().call_later(CPU_POLL_S, self._check_cpu)
        else:
            self._helpers.append(asyncio.ensure_future(self.kill(reason)))

    async def watch_cancel(self) -> None:
        if self.cancel is None:
            return
        await self.cancel.wait()
        self.cancelled = True
        await self.kill("cancelled")

    async def serve_channel(self) -> None:
        """A cell's: until its channel closes (an error there is the session lost, seen by
        `_until_end`; a single-use run watches its channel with `_on_channel_error`)."""
        with contextlib.suppress(Exception):
            await self.handle.channel.wait_closed()

    # -- the run -------------------------------------------------------------------------------
    async def run(self) -> Outcome:
        """Runs the job to its end and returns how it ended."""
        if self.cell is None:
            return await self._run_single_use()
        started = await self._start()
        exited = asyncio.ensure_future(self.handle.wait())
        ended = asyncio.ensure_future(self.ended.wait())
        try:
            await self._until_end(exited, ended)
            exit_code, wall = await self._settle_cell(exited, ended, started)
        finally:
            exited.cancel()
            ended.cancel()
            await self._stop()
        return self._outcome(exit_code, wall)

    async def _run_single_use(self) -> Outcome:
        """A single-use run: it ends with the sandbox's exit, once its output pipes and its
        channel have closed too (or `DRAIN_GRACE_S` after the exit). Those ends, the wall-time
        limit and the CPU watch are done-callbacks and timers on the loop, where a task and a
        wait per condition cost the host a few dozen loop callbacks per execution
        (`bench.host_profile`)."""
        handle = self.handle
        started = await self._start()
        loop = asyncio.get_running_loop()
        channel_closed = handle.channel.closed
        end = self._single_use_end = _SingleUseEnd(
            loop,
            handle.exit_future(),
            [handle.stdout.closed, handle.stderr.closed, channel_closed],
        )
        self._guest_done()  # should its frames have come with the job's first reads
        wall_timer = loop.call_later(self.job.limits.wall_time_ms / 1000, self._on_wall_time)
        try:
            await end.done
        finally:
            wall_timer.cancel()
            end.detach()
            self._single_use_end = None
            await self._stop()
        error = channel_closed.exception() if channel_closed.done() else None
        if error is not None:
            raise error  # a host bug: never hidden
        return self._outcome(end.exit_code, end.exited_at - started)

    def _on_wall_time(self) -> None:
        self._helpers.append(asyncio.ensure_future(self.kill("wall_time")))

    def _on_channel_error(self, closed: asyncio.Future[None]) -> None:
        """A single-use channel that ended with a host bug's exception: the sandbox goes, and
        `run` raises it afterwards."""
        if not closed.cancelled() and closed.exception() is not None and not self._stopping:
            self._helpers.append(asyncio.ensure_future(self.kill("host_error")))

    async def _start(self) -> float:
        """Serves output and channel, then sends the job; returns when the clock started."""
        handle = self.handle
        if self.cell is None:
            await handle.apply_limits(self.job.limits)
        else:
            self.usage_base = handle.usage()
        # The clock starts, and output and channel are served, before the job goes: the
        # script's first call may reach the channel thread at once.
        started = time.monotonic()
        self.broker.start_clock()
        handle.stdout.attach(self.stdout, self.on_output)
        handle.stderr.attach(self.stderr, self.on_output)
        handle.channel.serve(self, self.job.max_call_bytes + FRAME_OVERHEAD)
        handle.channel.send(encode_frame(self._frame()))
        if self.cell is None:
            # A single-use run: the channel's end is a callback, its CPU limit and a cancel are
            # watched by one timer, and nothing watches a cancel that nobody can set.
            handle.channel.closed.add_done_callback(self._on_channel_error)
            if self._watched() or self.cancel is not None:
                self._cpu_timer = asyncio.get_running_loop().call_later(CPU_POLL_S, self._check_cpu)
        else:
            self.cell.on_sent()
            self._helpers = [
                asyncio.ensure_future(self.serve_channel()),
                asyncio.ensure_future(self.watch_cpu()),
                asyncio.ensure_future(self.watch_cancel()),
            ]
        return started

    def _frame(self) -> dict[str, Any]:
        frame = job_frame(self.job, self.handle)
        cell = self.cell
        if cell is None:
            return frame
        frame["session"] = True
        if cell.rlimits_sent:
            del frame["rlimits"]  # applied once, by the first job; they cannot be raised
            if cell.stubs_sent:
                frame["stubs"] = ""
        else:
            frame["rlimits"]["cpu_s"] = _rlimit_cpu_s(cell.total_cpu_s, self.handle)
        return frame

    async def _until_end(self, exited: asyncio.Future[int], ended: asyncio.Future[Any]) -> None:
        """Waits for a cell's `end` frame, its sandbox's exit or its channel closing; kills it
        when the wall-time limit comes first."""
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

    async def _drain(self) -> None:
        """Output written just before the end is still in the pipes: drain, but not forever."""
        handle = self.handle
        await asyncio.wait([handle.stdout.closed, handle.stderr.closed], timeout=DRAIN_GRACE_S)

    async def _settle_cell(
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
        await self._drain()
        return exit_code, wall

    async def _stop(self) -> None:
        """No frame may reach the broker once the call log is read: calls the channel thread
        hands over from here on stay recorded as cancelled."""
        handle = self.handle
        self._stopping = True
        if self._cpu_timer is not None:
            self._cpu_timer.cancel()
            self._cpu_timer = None
        if self.cell is None:
            handle.channel.closed.remove_done_callback(self._on_channel_error)
            await handle.channel.close()
        else:  # the sandbox stays: serve the channel until the next cell
            handle.channel.serve(_Between(handle), self.job.max_call_bytes + FRAME_OVERHEAD)
        handle.stdout.detach()
        handle.stderr.detach()
        tasks = [*self._helpers, *self._calls.values()]
        for task in tasks:
            task.cancel()
        if tasks:
            # Bounded: a handler that swallows its cancel (a coroutine that catches
            # CancelledError and goes on) would otherwise hold the execution, and a server's
            # stop, for as long as it runs.
            done, stuck = await asyncio.wait(tasks, timeout=CALL_STOP_GRACE_S)
            for task in done:  # read, as gather did: not reported as never retrieved
                _retrieve(task)
            if stuck:
                self._abandon(stuck)
        if self.cell is None and self.killed_for is None:
            await handle.kill()

    def _abandon(self, stuck: set[asyncio.Future[Any]]) -> None:
        """Leaves tasks that did not end after their cancel: their calls stay recorded as
        cancelled (the broker is sealed at the outcome), their replies are never sent, and
        what they raise later is read here so it is not reported as never retrieved."""
        tools = sorted(
            self._waiting[call_id].tool
            for call_id, task in self._calls.items()
            if task in stuck and call_id in self._waiting
        )
        for task in stuck:
            task.add_done_callback(_retrieve)
        log.error(
            "execution %s: %d tasks did not end within %.1f s of their cancel and are abandoned"
            " (tool calls: %s): a handler that ignores cancellation; the calls are recorded as"
            " cancelled",
            self.broker.execution_id,
            len(stuck),
            CALL_STOP_GRACE_S,
            ", ".join(tools) or "none",
        )

    # -- the outcome ---------------------------------------------------------------------------
    def _outcome(self, exit_code: int, wall: float) -> Outcome:
        self.broker.finish()
        self.outputs.finish()
        resources = self.handle.usage()
        used = resources
        violations: list[Violation]
        if self.cell is None:
            violations = evidence.violations(self._observations(exit_code, wall, used))
        else:
            used = evidence.cell_share(self.usage_base, resources)
            violations = self._cell_violations(exit_code, wall, resources, used)
        return Outcome(
            exit_code=exit_code,
            end=self.end,
            stdout=self.stdout,
            stderr=self.stderr,
            violations=[*violations, *self.outputs.violations()],
            wall_time_s=wall,
            resources=used,
            isolation=list(self.handle.isolation),
            cancelled=self.cancelled,
            protocol_error=self.protocol_error,
            outputs=self.outputs.files,
            omitted_outputs=self.outputs.omitted,
        )

    def _cell_violations(
        self, exit_code: int, wall: float, resources: ResourceUsage, share: ResourceUsage
    ) -> list[Violation]:
        """A cell's violations, and why its session is lost (`lost`, None while it lives)."""
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
        if self.killed_for == "session_cpu_time" and self.cell is not None:
            found.append(
                evidence.session_cpu_violation(self.cell.total_cpu_s, resources.cpu_time_s)
            )
        if self.interrupted and alive:
            found = evidence.interrupted(found, self.killed_for)
        return found

    def _observations(
        self, exit_code: int, wall: float, resources: ResourceUsage
    ) -> evidence.Observations:
        return evidence.Observations(
            limits=self.job.limits,
            exit_code=exit_code,
            wall_time_s=wall,
            killed_for=self.killed_for,
            protocol_error=self.protocol_error,
            resources=resources,
            captures=tuple(
                evidence.Capture(s.name, s.limit, s.total, s.dropped)
                for s in (self.stdout, self.stderr)
            ),
            report=self.end.error if self.end is not None else None,
            script=self.job.script,
            pids_counted=self.handle.capabilities.cgroup_pids,
            own_signals_delivered=self.handle.capabilities.own_signals_delivered,
        )


class _SingleUseEnd:
    """The end of a single-use run: `done` resolves once every one of ``others`` (its output
    pipes and channel closing) has resolved and either the sandbox has exited or the guest has
    finished (`reported`: its `end` frame, then its `bye` once it closed its stdout and stderr;
    it exits next, and the stop kills what is left). After an exit, or while a descriptor stays
    open (a child of the script holding stdout), it resolves `DRAIN_GRACE_S` after the exit at
    the latest: output written just before the end is drained, but not forever.

    Why the guest's word ends it: the kernel tears a process's memory down before it closes
    its descriptors and reports its exit, and a sandbox's pid 1 maps the zygote's whole heap:
    waiting for that exit added a millisecond or two to every result (`bench.forkserver`, warm
    latency). Without its `bye` (a script that forged an `end` frame and exits otherwise) the
    exit decides, and the exit status the host observes is the one reported. A script that
    forges both frames and closes its output ends its run right there: it is killed, as if it
    had called ``os._exit`` with the code it claimed."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        exited: asyncio.Future[int],
        others: list[asyncio.Future[None]],
    ) -> None:
        self._loop = loop
        self._exited = exited
        self._others = others
        self._open = sum(not other.done() for other in others)
        self._grace: asyncio.TimerHandle | None = None
        self.done: asyncio.Future[None] = loop.create_future()
        self.exit_code = 0
        self.exited_at = 0.0
        self._reported: int | None = None  # the exit code the guest's end frame gave
        # Set by `_on_exit`, not read from ``exited``: a pipe's callback may run between the
        # exit future's result and its callback, before the exit code is known.
        self._exit_seen = False
        exited.add_done_callback(self._on_exit)
        for other in others:
            if not other.done():
                other.add_done_callback(self._on_other)

    def _on_exit(self, exited: asyncio.Future[int]) -> None:
        if self.done.done():
            return  # ended by the guest's report: its exit code and time stand
        self._exit_seen = True
        self.exited_at = time.monotonic()
        error = exited.exception() if not exited.cancelled() else asyncio.CancelledError()
        if error is not None:  # the backend lost the sandbox (e.g. its engine): `run` raises
            if not self.done.done():
                self.done.set_exception(error)
            return
        self.exit_code = exited.result()
        if self._open == 0:
            self._finish()
        else:
            self._grace = self._loop.call_later(DRAIN_GRACE_S, self._finish)

    def reported(self, exit_code: int) -> None:
        """The guest reported its end and hung up: once its pipes and channel are closed too,
        the run is over (``exit_code``: the one it reported, which it exits with)."""
        self._reported = exit_code
        if self._open == 0:
            self._finish_reported()

    def _on_other(self, _other: asyncio.Future[None]) -> None:
        self._open -= 1
        if self._open == 0:
            if self._exit_seen:
                self._finish()
            else:
                self._finish_reported()

    def _finish_reported(self) -> None:
        if self.done.done() or self._exit_seen or self._reported is None:
            return  # over, not reported, or the exit came first: `_on_exit` ends it
        self.exit_code = self._reported
        self.exited_at = time.monotonic()
        self._finish()

    def _finish(self) -> None:
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        if not self.done.done():
            self.done.set_result(None)

    def detach(self) -> None:
        """No callback runs from here on (the run is over, or cancelled)."""
        self._exited.remove_done_callback(self._on_exit)
        for other in self._others:
            other.remove_done_callback(self._on_other)
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None


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


async def run_session(
    handle: SandboxHandle,
    job: Job,
    broker: Broker,
    on_output: OutputCallback | None = None,
    cancel: asyncio.Event | None = None,
) -> Outcome:
    """Runs ``job`` in the single-use ``handle`` and returns how it ended; always disposes of
    the handle."""
    try:
        return await Drive(handle, job, broker, on_output, cancel).run()
    finally:
        await handle.dispose()
