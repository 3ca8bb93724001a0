"""The loop's epoll readers on real pipes, on asyncio's loop and on uvloop's.

What the sandboxes rely on: a watched descriptor's callback runs on the loop while it is
readable and at its end, and never after `unwatch`; a descriptor unwatched and reused within one
batch of events does not get the closed one's event; a failing callback is reported the way the
loop reports any, and the others in its batch still run; the epoll descriptor exists only while
something is watched.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from sandbox import epoll_readers

LOOPS = ["asyncio", "uvloop"]


def run(loop_name: str, coroutine: Callable[[], Coroutine[Any, Any, None]]) -> None:
    if loop_name == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    else:
        factory = asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(coroutine())


def epoll_fds() -> int:
    """This process's open epoll descriptors."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[eventpoll]":
                count += 1
        except OSError:
            continue
    return count


@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_watched_pipe_is_read_until_its_end_and_the_epoll_goes_with_the_last(
    loop_name: str,
) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        before = epoll_fds()
        readers = epoll_readers.for_loop()
        assert epoll_readers.for_loop(loop) is readers
        r, w = os.pipe()
        os.set_blocking(r, False)
        got: list[bytes] = []
        ended = loop.create_future()

        def readable() -> None:
            data = os.read(r, 100)
            got.append(data)
            if not data:
                readers.unwatch(r)
                ended.set_result(None)

        readers.watch(r, readable)
        assert epoll_fds() == before + 1
        with pytest.raises(ValueError, match=f"descriptor {r} is already watched"):
            readers.watch(r, readable)
        os.write(w, b"one")
        await asyncio.sleep(0.05)
        assert got == [b"one"]
        os.write(w, b"two")
        os.close(w)
        await asyncio.wait_for(ended, 5)
        assert b"".join(got) == b"onetwo" and got[-1] == b""
        assert epoll_fds() == before  # nothing watched: no epoll left open
        os.close(r)
        readers.unwatch(r)  # not watched: a no-op

    run(loop_name, scenario)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_no_callback_after_unwatch(loop_name: str) -> None:
    async def scenario() -> None:
        readers = epoll_readers.for_loop()
        r, w = os.pipe()
        calls: list[int] = []
        readers.watch(r, lambda: calls.append(1))
        readers.unwatch(r)
        os.write(w, b"x")
        await asyncio.sleep(0.05)
        assert calls == []
        os.close(r)
        os.close(w)

    run(loop_name, scenario)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_number_reused_within_one_batch_gets_none_of_the_closed_ones_events(
    loop_name: str,
) -> None:
    async def scenario() -> None:
        readers = epoll_readers.for_loop()
        first_r, first_w = os.pipe()
        second_r, second_w = os.pipe()
        calls: list[str] = []
        reused: list[int] = []

        def on_first() -> None:
            # Closes the other watched pipe and opens a new one in its number's place: the
            # batch already holds the closed pipe's event, which must not reach the new one.
            calls.append("first")
            readers.unwatch(first_r)
            readers.unwatch(second_r)
            os.close(second_r)
            new_r, new_w = os.pipe()
            reused.extend((new_r, new_w))
            readers.watch(new_r, lambda: calls.append("new"))

        def on_second() -> None:
            calls.append("second")

        readers.watch(first_r, on_first)
        readers.watch(second_r, on_second)
        os.write(first_w, b"x")
        os.write(second_w, b"x")
        await asyncio.sleep(0.05)
        # Whichever came first in the batch: the second's event never ran the new callback.
        assert "new" not in calls
        assert calls[0] in ("first", "second")
        assert "first" in calls
        new_r, new_w = reused
        assert new_r == second_r  # the number was reused (the test shows what it claims)
        os.write(new_w, b"y")
        await asyncio.sleep(0.05)
        assert calls[-1] == "new"  # a later batch's event is the new pipe's own
        readers.unwatch(new_r)
        for fd in (first_r, first_w, second_w, new_r, new_w):
            os.close(fd)

    run(loop_name, scenario)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_failing_callback_is_reported_and_the_rest_of_its_batch_runs(loop_name: str) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        reported: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, context: reported.append(context))
        readers = epoll_readers.for_loop()
        bad_r, bad_w = os.pipe()
        good_r, good_w = os.pipe()
        good: list[bytes] = []

        def bad() -> None:
            os.read(bad_r, 10)
            raise RuntimeError("a reader's bug")

        readers.watch(bad_r, bad)
        readers.watch(good_r, lambda: good.append(os.read(good_r, 10)))
        os.write(bad_w, b"x")
        os.write(good_w, b"y")
        await asyncio.sleep(0.05)
        assert good == [b"y"]
        assert len(reported) == 1
        assert str(reported[0]["exception"]) == "a reader's bug"
        assert reported[0]["message"] == f"exception in the reader of descriptor {bad_r}"
        readers.unwatch(bad_r)
        readers.unwatch(good_r)
        for fd in (bad_r, bad_w, good_r, good_w):
            os.close(fd)

    run(loop_name, scenario)
