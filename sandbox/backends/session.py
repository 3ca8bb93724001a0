"""Drives one sandbox through one job, the same way for every backend.

Sends the job, serves the tool channel through the broker, drains stdout and stderr into capped
buffers, and enforces the host-side limits: the wall-time deadline and the whole-sandbox CPU
budget (polled from the cgroup, since RLIMIT_CPU is per process). On any kill the whole sandbox
goes: the backend's `kill` takes every process, not just the first one.

A violation comes from what the host or the kernel observed, never from the guest's word (see
`sandbox.result.Evidence`); ``observed`` is a measurement or None:

==============  ===================================================  =========================
limit           what shows it, and ``observed``                      evidence
==============  ===================================================  =========================
wall_time       the host's deadline; the host's clock                host
cpu_time        cgroup CPU usage (watchdog) or SIGXCPU; the usage    kernel
memory          OOM kill, or failcnt with a reported MemoryError;    kernel (guest with no
                the cgroup's peak                                    memory cgroup)
processes       pids.events max; pids.peak where the kernel has it   kernel (guest where only
                                                                     RLIMIT_NPROC counts)
file_size       SIGXFSZ, or a full /tmp or /dev/shm with a reported  kernel, host (guest where
                EFBIG/ENOSPC; the tmpfs usage (fstatvfs)             the host cannot measure)
open_files      only the guest's report of EMFILE (no kernel         guest
                counter; its descriptors are closed by then); none
stdout/stderr   the capture's byte counts                            host
max_tool_calls  the broker's count of refused calls                  host
expected_calls  the broker's call log, after the end                 host
protocol        a frame the host rejected; none                      host
==============  ===================================================  =========================

A guest-only report whose line is the script's own ``raise`` statement is the script's output,
not a refusal: no violation.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from sandbox.backends.base import Job, Outcome, ResourceUsage, SandboxHandle
from sandbox.backends.outputs import OutputCollector
from sandbox.broker import Broker
from sandbox.capture import CappedOutput, OutputCallback
from sandbox.execution import evidence
from sandbox.protocol import (
    GuestCall,
    GuestEnd,
    GuestMessage,
    GuestOmit,
    GuestOutput,
    ProtocolViolation,
    encode_frame,
)
from sandbox.result import CallRecord, Violation

__all__ = ["block_buffered_output", "run_session"]

CPU_POLL_S = 0.05
DRAIN_GRACE_S = 1.0
FRAME_OVERHEAD = 4096

_BLOCK_BUFFERED_OUTPUT: ContextVar[bool] = ContextVar("ptc_block_buffered_output", default=False)


@contextlib.contextmanager
def block_buffered_output() -> Iterator[None]:
    """For bench/output.py only: jobs sent in this context leave the guest's stdout
    block-buffered, as it was before the guest made it line-buffered (the benchmark's
    baseline). A kill then takes what the buffer holds, so nothing else may use it."""
    token = _BLOCK_BUFFERED_OUTPUT.set(True)
    try:
        yield
    finally:
        _BLOCK_BUFFERED_OUTPUT.reset(token)


def job_frame(job: Job, handle: SandboxHandle) -> dict[str, Any]:
    limits = job.limits
    cpu_s = math.ceil(limits.cpu_time_ms / 1000)
    rlimits = {
        # The cgroup watchdog is exact for the whole sandbox; RLIMIT_CPU is the per-process
        # backstop, one second looser so that the precise check trips first.
        "cpu_s": cpu_s + 1 if handle.has_cgroup_cpu else cpu_s,
        "fsize_bytes": limits.file_size_bytes,
        "nofile": limits.open_files,
        "core_bytes": 0,
    }
    if not handle.has_cgroup_pids:
        rlimits["nproc"] = limits.processes
    if not handle.has_cgroup_memory:
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


class _Session:
    def __init__(
        self,
        handle: SandboxHandle,
        job: Job,
        broker: Broker,
        on_output: OutputCallback | None,
        cancel: asyncio.Event,
    ) -> None:
        self.handle = handle
        self.job = job
        self.broker = broker
        self.on_output = on_output
        self.cancel = cancel
        self.stdout = CappedOutput("stdout", job.limits.stdout_bytes)
        self.stderr = CappedOutput("stderr", job.limits.stderr_bytes)
        self.end: GuestEnd | None = None
        self.protocol_error: str | None = None
        self.killed_for: str | None = None
        self.cancelled = False
        self._calls: dict[int, asyncio.Task[None]] = {}  # 0: the kill after a violation
        self._waiting: dict[int, CallRecord] = {}  # calls the loop answers, by guest call id
        self._stopping = False
        self.outputs = OutputCollector(job.limits)

    async def kill(self, reason: str) -> None:
        if self.killed_for is None:
            self.killed_for = reason
            await self.handle.kill()

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
        if self._stopping:
            return
        if isinstance(message, GuestCall):
            # Output the script wrote before this call goes out before the call's request.
            self.handle.stdout.catch_up()
            self.handle.stderr.catch_up()
            self._calls[message.id] = asyncio.create_task(self.reply(message))
        elif isinstance(message, GuestEnd):
            self.end = message
        elif isinstance(message, (GuestOutput, GuestOmit)):
            try:
                self.outputs.receive(message)
            except ProtocolViolation as exc:
                self.deliver(exc)
        elif isinstance(message, ProtocolViolation) and self.protocol_error is None:
            self.protocol_error = str(message)
            self._calls[0] = asyncio.create_task(self.kill("protocol"))

    async def reply(self, call: GuestCall) -> None:
        frame = await self.broker.complete(call, self._waiting[call.id])
        # The id is free again before the guest can see the reply.
        del self._waiting[call.id]
        self.handle.channel.send(frame)

    async def serve_channel(self) -> None:
        try:
            await self.handle.channel.wait_closed()
        except Exception:
            await self.kill("host_error")  # a bug on our side; `run` raises it afterwards
            raise

    async def watch_cpu(self) -> None:
        if not self.handle.has_cgroup_cpu:
            return
        limit_s = self.job.limits.cpu_time_ms / 1000
        while True:
            await asyncio.sleep(CPU_POLL_S)
            if self.handle.usage().cpu_time_s >= limit_s:
                await self.kill("cpu_time")
                return

    async def watch_cancel(self) -> None:
        await self.cancel.wait()
        self.cancelled = True
        await self.kill("cancelled")

    async def _wait_end(self, timeout: float) -> bool:
        """Waits for the sandbox's exit; False when the wall-time limit came first."""
        try:
            await asyncio.wait_for(self.handle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def run(self) -> Outcome:
        handle, limits = self.handle, self.job.limits
        await handle.apply_limits(limits)
        # The clock starts, and output and channel are served, before the job goes: the
        # script's first call may reach the channel thread at once.
        started = time.monotonic()
        self.broker.start_clock()
        handle.stdout.attach(self.stdout, self.on_output)
        handle.stderr.attach(self.stderr, self.on_output)
        handle.channel.serve(self, self.job.max_call_bytes + FRAME_OVERHEAD)
        handle.channel.send(encode_frame(job_frame(self.job, handle)))
        helpers = [
            asyncio.create_task(self.serve_channel()),
            asyncio.create_task(self.watch_cpu()),
            asyncio.create_task(self.watch_cancel()),
        ]
        exit_code: int
        try:
            serve = helpers[0]
            ended = await self._wait_end(limits.wall_time_ms / 1000)
            if not ended:
                await self.kill("wall_time")
            # The exit code is always the kernel's, never the guest's report: a script can
            # forge an `end` frame and then exit otherwise.
            exit_code = await handle.wait()
            wall = time.monotonic() - started
            # Output written just before the end is still in the pipes: drain, but not forever.
            await asyncio.wait([handle.stdout.closed, handle.stderr.closed], timeout=DRAIN_GRACE_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(serve), DRAIN_GRACE_S)
        finally:
            # No frame may reach the broker once the call log is read: calls the thread hands
            # over from here on stay recorded as cancelled.
            self._stopping = True
            await handle.channel.close()
            handle.stdout.detach()
            handle.stderr.detach()
            for task in [*helpers, *self._calls.values()]:
                task.cancel()
            await asyncio.gather(*helpers, *self._calls.values(), return_exceptions=True)
            if self.killed_for is None:
                await handle.kill()
        self.broker.finish()
        self.outputs.finish()
        resources = handle.usage()
        return Outcome(
            exit_code=exit_code,
            end=self.end,
            stdout=self.stdout,
            stderr=self.stderr,
            violations=[*self._violations(exit_code, wall, resources), *self.outputs.violations()],
            wall_time_s=wall,
            resources=resources,
            isolation=list(handle.isolation),
            cancelled=self.cancelled,
            protocol_error=self.protocol_error,
            outputs=self.outputs.files,
            omitted_outputs=self.outputs.omitted,
        )

    def _violations(self, exit_code: int, wall: float, resources: ResourceUsage) -> list[Violation]:
        """What the host and kernel observed, and the guest's report weighed
        (`sandbox.execution.evidence`)."""
        return evidence.violations(
            evidence.Observations(
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
                pids_counted=self.handle.has_cgroup_pids,
                own_signals_delivered=self.handle.own_signals_delivered,
            )
        )


async def run_session(
    handle: SandboxHandle,
    job: Job,
    broker: Broker,
    on_output: OutputCallback | None = None,
    cancel: asyncio.Event | None = None,
) -> Outcome:
    """Runs ``job`` in ``handle`` and returns how it ended; always disposes of the handle."""
    try:
        return await _Session(handle, job, broker, on_output, cancel or asyncio.Event()).run()
    finally:
        await handle.dispose()
