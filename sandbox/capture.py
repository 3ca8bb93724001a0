"""Capped capture of a sandbox's stdout and stderr.

The host reads the pipes itself, keeps the first `limit` bytes and counts the rest: nothing is
cut silently, the rendered text ends with a marker naming the bytes dropped. Reading continues
past the cap so that the script never blocks on a full pipe; the wall-time limit bounds a flood.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["CappedOutput", "OutputCallback", "pump"]

OutputCallback = Callable[[str, bytes], None]
_CHUNK = 64 * 1024


class CappedOutput:
    def __init__(self, name: str, limit: int) -> None:
        self.name = name
        self.limit = limit
        self._kept = bytearray()
        self.total = 0

    @property
    def dropped(self) -> int:
        return self.total - len(self._kept)

    def feed(self, data: bytes) -> bytes:
        """Adds a chunk; returns the part that was kept (for live streaming)."""
        self.total += len(data)
        room = self.limit - len(self._kept)
        kept = data[: max(room, 0)]
        self._kept += kept
        return kept

    def text(self) -> str:
        out = self._kept.decode("utf-8", errors="replace")
        if self.dropped:
            out += (
                f"\n[ptc: {self.name} truncated: {self.dropped} bytes dropped of "
                f"{self.total}; the cap is {self.limit} bytes]\n"
            )
        return out


async def pump(
    reader: asyncio.StreamReader, sink: CappedOutput, on_output: OutputCallback | None
) -> None:
    """Drains a pipe into ``sink`` until end of file."""
    while True:
        chunk = await reader.read(_CHUNK)
        if not chunk:
            return
        kept = sink.feed(chunk)
        if kept and on_output is not None:
            on_output(sink.name, kept)
