"""`HostThreads`: plain-function host handlers run on daemon threads of their own, at most
``size`` at once; a call whose caller gave up before a thread took it is never run."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from sandbox.server.host_threads import HostThreads

WAIT_S = 30.0  # bounds for events that come at once; never a timed assertion
REQUEST = contextvars.ContextVar("REQUEST", default="none")


def test_at_most_size_threads_run_and_the_next_call_waits_for_one() -> None:
    async def scenario() -> None:
        before = set(threading.enumerate())
        threads = HostThreads(2)
        release = [threading.Event() for _ in range(3)]
        started = [threading.Event() for _ in range(3)]

        def handler(i: int) -> int:
            started[i].set()
            assert release[i].wait(WAIT_S)
            return i * 10

        calls = [asyncio.create_task(threads.run(f"t{i}", handler, {"i": i})) for i in range(3)]
        await asyncio.to_thread(started[0].wait, WAIT_S)
        await asyncio.to_thread(started[1].wait, WAIT_S)
        assert sorted(tool for tool, _ in threads.busy()) == ["t0", "t1"]
        assert not started[2].is_set()  # both threads are taken: the third call waits
        release[1].set()
        assert await calls[1] == 10
        await asyncio.to_thread(started[2].wait, WAIT_S)  # the freed thread takes it
        release[0].set()
        release[2].set()
        assert [await calls[0], await calls[2]] == [0, 20]
        ours = [
            t
            for t in threading.enumerate()
            if t not in before and t.name.startswith("ptc-host-handler-")  # not to_thread's
        ]
        assert sorted(t.name for t in ours) == ["ptc-host-handler-1", "ptc-host-handler-2"]
        assert all(t.daemon for t in ours)
        assert threads.busy() == []
        threads.close()  # idle threads end: nothing is left behind
        for thread in ours:
            thread.join(WAIT_S)
            assert not thread.is_alive()
        with pytest.raises(RuntimeError, match="the host handler threads are closed"):
            await threads.run("late", int, {})

    asyncio.run(scenario())


def test_a_call_given_up_before_a_thread_took_it_is_not_run() -> None:
    async def scenario() -> None:
        threads = HostThreads(1)
        release = threading.Event()
        ran: list[str] = []

        def first() -> None:
            release.wait(WAIT_S)
            ran.append("first")

        def second() -> None:
            ran.append("second")

        running = asyncio.create_task(threads.run("first", first, {}))
        await asyncio.sleep(0)
        waiting = asyncio.create_task(threads.run("second", second, {}))
        await asyncio.sleep(0)
        waiting.cancel()  # its caller's timeout, say
        with pytest.raises(asyncio.CancelledError):
            await waiting
        release.set()
        await running
        marker = asyncio.create_task(threads.run("third", lambda: ran.append("third"), {}))
        await marker  # the same single thread: the second job was taken and skipped before it
        assert ran == ["first", "third"]
        threads.close()

    asyncio.run(scenario())


def test_errors_and_the_callers_context_reach_the_handler_and_back() -> None:
    async def scenario() -> None:
        threads = HostThreads(1)

        def broken() -> None:
            raise KeyError("nope")

        REQUEST.set("req-7")
        assert await threads.run("ctx", REQUEST.get, {}) == "req-7"
        with pytest.raises(KeyError, match="nope"):
            await threads.run("broken", broken, {})
        threads.close()

    asyncio.run(scenario())


def test_a_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="size must be at least 1, got 0"):
        HostThreads(0)
