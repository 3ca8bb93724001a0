"""`eventloop.run(..., leftover_grace_s=...)`, as `ptc serve` runs: what still runs when the main
coroutine returns is cancelled and given the bound; a task that ignores its cancel is logged and
left, where `asyncio.run` waited for it for ever (a server that had stopped never exited)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from sandbox import eventloop


async def _stubborn() -> None:
    while True:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)


async def _polite(cancelled: list[str]) -> None:
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        cancelled.append("polite")
        raise


def test_a_task_that_ignores_its_cancel_is_left_and_named(caplog: pytest.LogCaptureFixture) -> None:
    cancelled: list[str] = []
    tasks: list[asyncio.Task[None]] = []

    async def main() -> str:
        tasks.append(asyncio.create_task(_stubborn(), name="stubborn"))
        tasks.append(asyncio.create_task(_polite(cancelled), name="polite"))
        await asyncio.sleep(0)
        return "served"

    with caplog.at_level(logging.ERROR, logger="sandbox.eventloop"):
        assert eventloop.run(main(), leftover_grace_s=0.2) == "served"
    assert cancelled == ["polite"]
    assert [t.done() for t in tasks] == [False, True]
    assert [r.getMessage() for r in caplog.records if r.name == "sandbox.eventloop"] == [
        "1 tasks did not end within 0.2 s of their cancel at exit and are left: "
        "stubborn (_stubborn)"
    ]


def test_nothing_left_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> int:
        return 7

    with caplog.at_level(logging.ERROR, logger="sandbox.eventloop"):
        assert eventloop.run(main(), leftover_grace_s=0.2) == 7
    assert [r for r in caplog.records if r.name == "sandbox.eventloop"] == []
