"""Host handlers the test server registers by ``module:function`` (run on the host)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path


def add(a: int, b: int) -> int:
    return a + b


def slow(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


def broken() -> None:
    raise RuntimeError("the host tool broke")


def blocks(mark: str) -> str:
    """Says it started (creates ``mark``), then blocks for an hour: a handler stuck in a call
    with no timeout of its own."""
    Path(mark).touch()
    time.sleep(3600)
    return "never"


async def ignores_cancel(mark: str) -> str:
    """Says it started, then swallows every cancel: a coroutine that never ends."""
    Path(mark).touch()
    while True:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)
