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

import ast
import asyncio
import base64
import contextlib
import math
import signal
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from sandbox.backends.base import Job, Outcome, ResourceUsage, SandboxHandle
from sandbox.backends.outputs import OutputCollector
from sandbox.broker import Broker
from sandbox.capture import CappedOutput, OutputCallback
from sandbox.protocol import (
    GuestCall,
    GuestEnd,
    GuestMessage,
    GuestOmit,
    GuestOutput,
    ProtocolViolation,
    encode_frame,
)
from sandbox.result import CallRecord, Evidence, Violation

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
        """What the host and kernel observed; `_claimed_violation` weighs the guest's report."""
        limits = self.job.limits
        out: list[Violation] = []
        if self.killed_for == "protocol":
            out.append(
                Violation(
                    "protocol",
                    0,
                    None,
                    "count",
                    "killed",
                    self.protocol_error or "",
                    evidence=Evidence.HOST,
                )
            )
        if self.killed_for == "wall_time":
            out.append(
                Violation(
                    "wall_time",
                    limits.wall_time_ms / 1000,
                    round(wall, 3),
                    "s",
                    "killed",
                    evidence=Evidence.HOST,
                )
            )
        peak_memory = resources.peak_memory_bytes if resources.accounted else None
        if resources.oom_killed:
            out.append(
                Violation(
                    "memory",
                    limits.memory_bytes,
                    peak_memory,
                    "bytes",
                    "killed",
                    "the sandbox ran out of memory and was killed",
                    evidence=Evidence.KERNEL,
                )
            )
        # A signal is the kernel's word only where the counters agree: a script can send
        # SIGXCPU or SIGXFSZ to itself. RLIMIT_CPU is looser than the whole-sandbox budget, so
        # a real SIGXCPU comes with the cgroup's usage past the limit; a real SIGXFSZ with a
        # full tmpfs (it is as large as the file size limit). Where the tmpfs cannot be
        # measured, SIGXFSZ is trusted only if the kernel spares the script its own signals.
        cpu_signal = exit_code in (-signal.SIGXCPU, 128 + signal.SIGXCPU) and (
            not resources.accounted or resources.cpu_time_s * 1000 >= limits.cpu_time_ms
        )
        fsize_signal = exit_code in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ) and (
            any(t.full for t in resources.tmpfs)
            if resources.tmpfs
            else not self.handle.own_signals_delivered
        )
        if self.killed_for == "cpu_time" or cpu_signal:
            out.append(
                Violation(
                    "cpu_time",
                    limits.cpu_time_ms / 1000,
                    round(resources.cpu_time_s, 3) if resources.accounted else None,
                    "s",
                    "killed",
                    evidence=Evidence.KERNEL,
                )
            )
        if resources.pids_limit_hit or resources.pids_limit_hits:
            refused = resources.pids_limit_hits
            out.append(
                Violation(
                    "processes",
                    limits.processes,
                    resources.peak_pids,
                    "count",
                    "refused",
                    f"the kernel refused {refused or 'some'} process or thread creations"
                    " at the limit",
                    evidence=Evidence.KERNEL,
                )
            )
        fullest = max(resources.tmpfs, key=lambda t: t.used_bytes, default=None)
        if fsize_signal:
            out.append(
                Violation(
                    "file_size",
                    limits.file_size_bytes,
                    fullest.used_bytes if fullest else None,
                    "bytes",
                    "killed",
                    "a write past the file size limit was killed by SIGXFSZ",
                    evidence=Evidence.KERNEL,
                )
            )
        else:
            claimed = self._claimed_violation(resources)
            if claimed is not None:
                out.append(claimed)
        for sink in (self.stdout, self.stderr):
            if sink.dropped:
                out.append(
                    Violation(
                        f"{sink.name}_bytes",
                        sink.limit,
                        sink.total,
                        "bytes",
                        "truncated",
                        f"{sink.dropped} bytes dropped",
                        evidence=Evidence.HOST,
                    )
                )
        return out

    def _claimed_violation(self, resources: ResourceUsage) -> Violation | None:
        """The violation behind the guest's report of a refusal, if the host can stand by it.

        The report (`end` frame) is the script's to forge: it names a refusal only the guest
        saw (MemoryError, EMFILE, EFBIG, ENOSPC). Where the host has a counter for that limit,
        the counter decides and the report alone proves nothing; where it has none, the
        violation says ``guest``, unless the line the report names is the script's own
        ``raise`` statement.
        """
        if self.end is None or not self.end.error:
            return None
        error = self.end.error
        limits = self.job.limits
        kind = str(error.get("type", ""))
        errno_name = error.get("errno")
        if kind == "MemoryError":
            if resources.oom_killed:
                return None  # reported above, from the kernel's own event
            if resources.accounted:
                if not resources.memory_limit_hits:
                    return None
                return Violation(
                    "memory",
                    limits.memory_bytes,
                    resources.peak_memory_bytes,
                    "bytes",
                    "refused",
                    "an allocation was refused; the memory cgroup reached its limit "
                    f"{resources.memory_limit_hits} times",
                    evidence=Evidence.KERNEL,
                )
            if self._script_raised(error):
                return None
            return Violation(
                "memory",
                limits.memory_bytes,
                None,
                "bytes",
                "refused",
                "the script reported a MemoryError under the address-space rlimit",
                evidence=Evidence.GUEST,
            )
        if errno_name in ("EFBIG", "ENOSPC"):
            if resources.tmpfs:
                full = [t for t in resources.tmpfs if t.full]
                if not full:
                    return None
                where = full[0]
                return Violation(
                    "file_size",
                    limits.file_size_bytes,
                    where.used_bytes,
                    "bytes",
                    "refused",
                    f"a write failed with {errno_name}; the sandbox's {where.mount} was full"
                    f" ({where.used_bytes} of {where.size_bytes} bytes)",
                    evidence=Evidence.HOST,
                )
            if self._script_raised(error):
                return None
            return Violation(
                "file_size",
                limits.file_size_bytes,
                None,
                "bytes",
                "refused",
                f"the script reported a write that failed with {errno_name}",
                evidence=Evidence.GUEST,
            )
        thread_refused = kind == "RuntimeError" and error.get("message") == "can't start new thread"
        # A refused fork raises BlockingIOError (EAGAIN), which non-blocking I/O raises too:
        # only one the guest saw come out of a process start under the job's RLIMIT_NPROC
        # (`refused_by`, see the bootstrap's `_process_start_refused`) is claimed.
        fork_refused = (
            kind == "BlockingIOError"
            and errno_name == "EAGAIN"
            and error.get("refused_by") == "RLIMIT_NPROC"
        )
        if (thread_refused or fork_refused) and not self.handle.has_cgroup_pids:
            # RLIMIT_NPROC (no pids cgroup here, or gVisor's kernel counting the script's
            # tasks) refused it: no host counter saw it.
            if self._script_raised(error):
                return None
            what = "thread" if thread_refused else "process"
            return Violation(
                "processes",
                limits.processes,
                None,
                "count",
                "refused",
                f"the script reported a {what} start refused at the limit",
                evidence=Evidence.GUEST,
            )
        if errno_name == "EMFILE":
            # RLIMIT_NOFILE has no kernel counter, and the descriptors are closed as the error
            # unwinds, before the report: only the guest ever sees this refusal.
            if self._script_raised(error):
                return None
            return Violation(
                "open_files",
                limits.open_files,
                None,
                "count",
                "refused",
                "the script reported an open that failed with EMFILE",
                evidence=Evidence.GUEST,
            )
        return None

    def _script_raised(self, error: dict[str, Any]) -> bool:
        """Whether the report's line is a ``raise`` statement of the script: the script made
        the error up itself, no kernel refused anything."""
        line = error.get("line")
        if not isinstance(line, int) or isinstance(line, bool) or line <= 0:
            return False
        return line in _raise_lines(self.job.script)


def _raise_lines(script: str) -> set[int]:
    """The lines of every ``raise`` statement in the script."""
    try:
        tree = ast.parse(script)
    except (SyntaxError, ValueError):
        return set()
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


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
