"""What every drive of a job in a sandbox shares, the same way for every backend.

A drive sends the job, serves the tool channel through the broker, drains stdout and stderr into
capped buffers and enforces the host-side limits: the wall-time deadline and the whole-sandbox
CPU budget (polled from the cgroup, since RLIMIT_CPU is per process). Two machines run it, each
in its own module and readable alone:

* `sandbox.execution.single_use.SingleUseRun`: a single-use sandbox. The execution ends when
  the sandbox exits (or the guest reports its end and hangs up); on any kill the whole sandbox
  goes. The exit code is the kernel's, never the guest's word alone.
* `sandbox.execution.cell.CellRun`: a session's cell. The sandbox stays; the execution ends
  with the guest's `end` frame, stops by `interrupt` first, and may lose the session.

`Drive` is their common part: the channel's two ends (`inline` on the channel thread,
`deliver` on the loop), the kill once, the CPU arithmetic, the bounded stop of tool calls and
helpers, and the outcome; each machine fills in the steps its docstring names. What the host
and the kernel observed becomes violations in `sandbox.execution.evidence`.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import math
import time
from typing import Any

from sandbox.backends.base import Job, Outcome, ResourceUsage, SandboxHandle
from sandbox.capture import CappedOutput, OutputCallback
from sandbox.execution import evidence
from sandbox.execution.broker import Broker
from sandbox.execution.outputs import OutputCollector
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
    "CPU_POLL_S",
    "DRAIN_GRACE_S",
    "FRAME_OVERHEAD",
    "Drive",
    "job_frame",
    "rlimit_cpu_s",
]

CPU_POLL_S = 0.05
DRAIN_GRACE_S = 1.0
# How long the stop waits for tool calls and helpers it cancelled before it leaves them.
CALL_STOP_GRACE_S = 2.0
FRAME_OVERHEAD = 4096
log = logging.getLogger(__name__)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def job_frame(job: Job, handle: SandboxHandle) -> dict[str, Any]:
    """The `job` frame that starts ``job`` in ``handle`` (see `sandbox.protocol`)."""
    limits = job.limits
    rlimits = {
        "cpu_s": rlimit_cpu_s(limits.cpu_time_ms / 1000, handle),
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
    return frame


def rlimit_cpu_s(limit_s: float, handle: SandboxHandle) -> int:
    # The cgroup watchdog is exact for the whole sandbox; RLIMIT_CPU is the per-process
    # backstop, one second looser so that the precise check trips first.
    cpu_s = math.ceil(limit_s)
    return cpu_s + 1 if handle.capabilities.cgroup_cpu else cpu_s


class Drive:
    """Drives one job in one sandbox to its end, once (`run`). A machine fills in:
    `run` (when it ends), `_prepare` (before the clock starts), `_frame` (the job frame it
    sends), `_watch` (what watches it once the job has gone), `_stop_gently` (a kill's first
    step), `_release` (the channel at the stop) and `_violations` (the outcome's evidence)."""

    def __init__(
        self,
        handle: SandboxHandle,
        job: Job,
        broker: Broker,
        on_output: OutputCallback | None,
        cancel: asyncio.Event | None,
    ) -> None:
        self.handle, self.job, self.broker = handle, job, broker
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
        self._calls: dict[int, asyncio.Task[None]] = {}  # 0: the kill after a violation
        self._waiting: dict[int, CallRecord] = {}  # calls the loop answers, by guest call id
        self._helpers: list[asyncio.Future[Any]] = []
        self._stopping = False
        self.hung_up = False  # the guest's `bye`: it closed its output and exits next

    async def run(self) -> Outcome:
        """Runs the job to its end and returns how it ended."""
        raise NotImplementedError

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
        if isinstance(message, ProtocolViolation):
            self._protocol_seen(message)
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

    def _protocol_seen(self, violation: ProtocolViolation) -> None:
        """Any protocol violation, also one that comes during the stop."""

    def _guest_done(self) -> None:
        """The guest reported its end or hung up."""

    async def reply(self, call: GuestCall) -> None:
        frame = await self.broker.complete(call, self._waiting[call.id])
        # The id is free again before the guest can see the reply.
        del self._waiting[call.id]
        if self._stopping:  # a call abandoned at the stop: a session's next cell must not get it
            return
        self.handle.channel.send(frame)

    # -- the start -----------------------------------------------------------------------------
    async def _start(self) -> float:
        """Serves output and channel, then sends the job; returns when the clock started."""
        handle = self.handle
        await self._prepare()
        # The clock starts, and output and channel are served, before the job goes: the
        # script's first call may reach the channel thread at once.
        started = time.monotonic()
        self.broker.start_clock()
        handle.stdout.attach(self.stdout, self.on_output)
        handle.stderr.attach(self.stderr, self.on_output)
        handle.channel.serve(self, self.job.max_call_bytes + FRAME_OVERHEAD)
        handle.channel.send(encode_frame(self._frame()))
        self._watch()
        return started

    async def _prepare(self) -> None:
        """Before the clock starts and the job goes."""

    def _frame(self) -> dict[str, Any]:
        return job_frame(self.job, self.handle)

    def _watch(self) -> None:
        """Once the job has gone: start what watches the run."""

    # -- stopping ------------------------------------------------------------------------------
    async def kill(self, reason: str) -> None:
        """Kills the sandbox, once (unless `_stop_gently` stopped the execution without it)."""
        if self.killed_for is not None:
            return
        self.killed_for = reason
        if await self._stop_gently(reason):
            return
        await self.handle.kill()

    async def _stop_gently(self, reason: str) -> bool:
        """Whether the execution stopped for ``reason`` without killing the sandbox."""
        return False

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
        return "cpu_time" if used_s >= self.job.limits.cpu_time_ms / 1000 else None

    async def _stop(self) -> None:
        """No frame may reach the broker once the call log is read: calls the channel thread
        hands over from here on stay recorded as cancelled."""
        handle = self.handle
        self._stopping = True
        await self._release()
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

    async def _release(self) -> None:
        """At the stop, before output and calls: what becomes of the channel."""

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
        used, violations = self._violations(exit_code, wall, self.handle.usage())
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

    def _violations(
        self, exit_code: int, wall: float, resources: ResourceUsage
    ) -> tuple[ResourceUsage, list[Violation]]:
        """The usage the execution is charged and its violations, from the sandbox's usage."""
        return resources, evidence.violations(self._observations(exit_code, wall, resources))

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
