"""`dump_stacks` shows where each asyncio task waits, down its whole chain of awaits: a suspended
task's own stack (`Task.get_stack`) is one frame, its outer coroutine's, which is how a hung
`ptc serve` once hid that its stop awaited a health watch ten calls down."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile

from sandbox.telemetry.stacks import awaited_frames, dump_stacks


async def _outer(gate: asyncio.Event) -> None:
    await _middle(gate)


async def _middle(gate: asyncio.Event) -> None:
    await _inner(gate)


async def _inner(gate: asyncio.Event) -> None:
    await gate.wait()


def _dump() -> str:
    """What `dump_stacks` writes, from inside the running loop (faulthandler needs a real
    file)."""
    with tempfile.TemporaryFile("w+") as out:
        dump_stacks(out)
        out.seek(0)
        return out.read()


def test_the_dump_follows_the_awaits_to_the_innermost_coroutine() -> None:
    async def scenario() -> str:
        gate = asyncio.Event()
        task = asyncio.create_task(_outer(gate), name="stuck-one")
        await asyncio.sleep(0)  # let it reach the gate
        assert [f.f_code.co_name for f in task.get_stack()] == ["_outer"]  # what we had
        written = _dump()
        gate.set()
        await task
        return written

    text = asyncio.run(scenario())
    block = text.split("task stuck-one (_outer):\n", 1)[1].split("task ", 1)[0]
    names = [line.rsplit(" in ", 1)[1] for line in block.splitlines() if " in " in line]
    assert names == ["_outer", "_middle", "_inner", "wait"], block
    assert "  awaiting Future\n" in block, block
    assert text.rstrip().endswith("--- end of stacks ---")


def test_a_task_awaiting_a_task_names_it() -> None:
    async def scenario() -> str:
        gate = asyncio.Event()
        child = asyncio.create_task(gate.wait(), name="the-child")

        async def parent() -> None:
            await child

        task = asyncio.create_task(parent(), name="the-parent")
        await asyncio.sleep(0)
        written = _dump()
        gate.set()
        await task
        return written

    text = asyncio.run(scenario())
    block = text.split("task the-parent (", 1)[1].split("\ntask ", 1)[0]
    assert "  awaiting task the-child" in block, block


def test_a_finished_coroutine_has_no_frames() -> None:
    async def done() -> int:
        return 1

    coro = done()
    with contextlib.suppress(StopIteration):
        coro.send(None)
    assert awaited_frames(coro) == []
