"""When a single-use run is over (`sandbox.execution.single_use._SingleUseEnd`), driven by real
futures on a real event loop in the order the host can see them: the guest's report and hang-up,
its pipes and channel closing, its exit."""

from __future__ import annotations

import asyncio

import pytest

from sandbox.execution import single_use
from sandbox.execution.single_use import _SingleUseEnd


class _Run:
    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[int] = self.loop.create_future()
        self.others: list[asyncio.Future[None]] = [self.loop.create_future() for _ in range(3)]
        self.end = _SingleUseEnd(self.loop, self.exited, self.others)

    def close_all(self) -> None:
        for other in self.others:
            other.set_result(None)


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def test_a_guest_that_reported_and_hung_up_ends_before_its_exit() -> None:
    async def body() -> None:
        run = _Run()
        run.end.reported(4)
        await _settle()
        assert not run.end.done.done()  # its output is not closed yet
        run.close_all()
        await _settle()
        assert run.end.done.done() and not run.exited.done()
        assert run.end.exit_code == 4 and run.end.exited_at > 0
        # The exit that follows changes nothing.
        run.exited.set_result(-9)
        await _settle()
        assert run.end.exit_code == 4
        run.end.detach()

    asyncio.run(body())


def test_without_a_report_the_exit_decides() -> None:
    async def body() -> None:
        run = _Run()
        run.close_all()
        await _settle()
        assert not run.end.done.done()
        run.exited.set_result(3)
        await _settle()
        assert run.end.done.done() and run.end.exit_code == 3
        run.end.detach()

    asyncio.run(body())


def test_a_report_with_output_still_open_waits_for_the_exit() -> None:
    async def body() -> None:
        # A child of the script holds stdout: the guest's word does not end the run, its exit does.
        run = _Run()
        run.end.reported(0)
        run.others[1].set_result(None)
        run.others[2].set_result(None)
        await _settle()
        assert not run.end.done.done()
        run.exited.set_result(1)
        run.others[0].set_result(None)
        await _settle()
        assert run.end.done.done() and run.end.exit_code == 1
        run.end.detach()

    asyncio.run(body())


def test_a_pipe_closed_by_the_exit_before_its_callback_waits_for_the_exit_code() -> None:
    async def body() -> None:
        # The kernel closes a process's descriptors before it reports its exit, so a pipe's
        # callback can run while the exit future is resolved but its callback has not run yet: the
        # run must not end then with an exit code it does not know.
        run = _Run()
        run.others[0].set_result(None)
        run.others[1].set_result(None)
        await _settle()
        run.others[2].set_result(None)  # its callback is queued first...
        run.exited.set_result(3)  # ...the exit's after it
        await _settle()
        assert run.end.done.done()
        assert run.end.exit_code == 3 and run.end.exited_at > 0
        run.end.detach()

    asyncio.run(body())


def test_an_exit_with_a_pipe_left_open_ends_after_the_drain_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def body() -> None:
        monkeypatch.setattr(single_use, "DRAIN_GRACE_S", 0.05)
        run = _Run()
        run.others[0].set_result(None)
        run.exited.set_result(0)
        await _settle()
        assert not run.end.done.done()
        await asyncio.wait_for(run.end.done, 5)
        assert run.end.exit_code == 0
        run.end.detach()

    asyncio.run(body())
