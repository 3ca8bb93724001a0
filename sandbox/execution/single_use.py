"""`SingleUseRun`: one execution in a fresh single-use sandbox, to the sandbox's end.

The execution ends when the sandbox exits, or when the guest has reported its end and hung up
once its output pipes and channel have closed (`_SingleUseEnd` says why the guest's word may end
it); on any kill the whole sandbox goes (the backend's `kill` takes every process), and the stop
kills what is left. The exit code is the kernel's, or the one the guest reported and exits
with: a script can forge an `end` frame and then exit otherwise, and then the exit decides.

Its ends, the wall-time limit and the CPU watch are done-callbacks and timers on the loop
rather than a task and a wait per condition, which would cost the host a few dozen loop
callbacks per execution (`bench.host_profile`). The common drive (channel, kill, stop,
outcome) is `sandbox.execution.drive.Drive`.
"""

from __future__ import annotations

import asyncio
import time

from sandbox.backends.base import Job, Outcome, SandboxHandle
from sandbox.capture import OutputCallback
from sandbox.execution.broker import Broker
from sandbox.execution.drive import CPU_POLL_S, DRAIN_GRACE_S, Drive

__all__ = ["SingleUseRun", "run_single_use"]


class SingleUseRun(Drive):
    """Drives one job in a single-use sandbox to the sandbox's end: `run` once."""

    # Set while it runs (the base's constructor is the whole of its own).
    _cpu_timer: asyncio.TimerHandle | None = None
    _end: _SingleUseEnd | None = None

    async def run(self) -> Outcome:
        """Runs the job until the sandbox's end (`_SingleUseEnd`); then the stop, and the
        outcome. A channel that ended with a host bug's exception is raised, never hidden."""
        handle = self.handle
        started = await self._start()
        loop = asyncio.get_running_loop()
        channel_closed = handle.channel.closed
        end = self._end = _SingleUseEnd(
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
            self._end = None
            await self._stop()
        error = channel_closed.exception() if channel_closed.done() else None
        if error is not None:
            raise error  # a host bug: never hidden
        return self._outcome(end.exit_code, end.exited_at - started)

    async def _prepare(self) -> None:
        await self.handle.apply_limits(self.job.limits)

    def _watch(self) -> None:
        """The channel's end is a callback, the CPU limit and a cancel are watched by one
        timer, and nothing watches a cancel that nobody can set."""
        self.handle.channel.closed.add_done_callback(self._on_channel_error)
        if self._watched() or self.cancel is not None:
            self._cpu_timer = asyncio.get_running_loop().call_later(CPU_POLL_S, self._check_cpu)

    def _guest_done(self) -> None:
        """A guest that reported its end and then hung up has finished: its run ends once its
        output and channel are closed, without waiting for its exit.

        Where the host sums the sandbox's processes, it reads them here, at the `bye`: the
        guest waits for the channel's close before it exits (the channel closes after this
        callback), so the read sees its CPU time with every child it reaped. Read after its
        exit, the figures would be the last poll's (up to `CPU_POLL_S` old, more on a loaded
        host): the CPU its children burnt since then was lost."""
        if self.hung_up and self.handle.capabilities.host_accounting:
            self.handle.usage()
        if self._end is not None and self.end is not None and self.hung_up:
            self._end.reported(self.end.exit_code)

    def _on_wall_time(self) -> None:
        self._helpers.append(asyncio.ensure_future(self.kill("wall_time")))

    def _on_channel_error(self, closed: asyncio.Future[None]) -> None:
        """A channel that ended with a host bug's exception: the sandbox goes, and `run`
        raises it afterwards."""
        if not closed.cancelled() and closed.exception() is not None and not self._stopping:
            self._helpers.append(asyncio.ensure_future(self.kill("host_error")))

    def _check_cpu(self) -> None:
        """The watch, every `CPU_POLL_S`: the CPU limit and a cancel. A timer, not a task for
        each (the loop's bookkeeping for a task per execution is host CPU every execution
        pays, `bench.forkserver`); a cancel is therefore seen within `CPU_POLL_S`, not at
        once."""
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

    async def _release(self) -> None:
        """The sandbox is done with: its timer and channel end here."""
        if self._cpu_timer is not None:
            self._cpu_timer.cancel()
            self._cpu_timer = None
        self.handle.channel.closed.remove_done_callback(self._on_channel_error)
        await self.handle.channel.close()

    async def _stop(self) -> None:
        await super()._stop()
        if self.killed_for is None:
            await self.handle.kill()


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


async def run_single_use(
    handle: SandboxHandle,
    job: Job,
    broker: Broker,
    on_output: OutputCallback | None = None,
    cancel: asyncio.Event | None = None,
) -> Outcome:
    """Runs ``job`` in the single-use ``handle`` and returns how it ended; always disposes of
    the handle."""
    try:
        return await SingleUseRun(handle, job, broker, on_output, cancel).run()
    finally:
        await handle.dispose()
