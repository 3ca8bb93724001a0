"""The readiness check gives way to a cancellation that comes just as the store's ping answers.

`SandboxServer.stop` cancels the health watch and awaits it. On Python 3.11 `asyncio.wait_for`
returns the result instead of raising when the cancellation and the awaited future's completion
meet (fixed in 3.12), so the watch went on polling for ever and `ptc serve` never stopped after
SIGTERM (seen once in ~30 stops; its stacks, `kill -USR1`, showed `stop` awaiting the watch).
The moment is made exactly here: the ping's future completes, the shield passes its result on,
and the cancel arrives before the checking task runs again."""

from __future__ import annotations

import asyncio

import pytest

from sandbox.server.fleet import Readiness


class _Store:
    def schema_version(self) -> int:  # never called: the test holds the ping itself
        raise AssertionError("the ping in flight is reused")


def test_a_cancel_as_the_ping_answers_ends_the_check() -> None:
    async def scenario() -> None:
        readiness = Readiness(_Store())  # type: ignore[arg-type]
        ping: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        readiness._ping = ping  # a ping in flight: `_one_at_a_time` waits for it
        check = asyncio.ensure_future(readiness._store_reachable())
        for _ in range(3):
            await asyncio.sleep(0)  # the check now waits for the ping
        ping.set_result(7)
        await asyncio.sleep(0)  # the shield has the result; the check has not run again
        check.cancel()
        with pytest.raises(asyncio.CancelledError):
            await check
        assert check.cancelled()

    asyncio.run(scenario())


def test_a_ping_that_answers_is_reachable_and_one_that_fails_is_not() -> None:
    async def scenario() -> tuple[bool, bool]:
        readiness = Readiness(_Store())  # type: ignore[arg-type]
        readiness._ping = asyncio.ensure_future(asyncio.sleep(0, 7))
        reachable = await readiness._store_reachable()
        readiness._ping = asyncio.ensure_future(_raise())
        unreachable = await readiness._store_reachable()
        return reachable, unreachable

    assert asyncio.run(scenario()) == (True, False)


async def _raise() -> None:
    await asyncio.sleep(0)
    raise OSError("database is locked")
