"""`ptc run`'s status line: on a terminal, one line on stderr for runs longer than a second.

    [ptc] 3.0s of 30s · 4 of 100 tool calls · cpu 0.41s · peak 23.1 MiB

Embedded, it reads the engine's `LiveProbe` (``on_started``) from a ticker on the event loop;
with ``--server`` it shows the `Progress` events the server streams (``on_progress``). The line
is erased before any output of the script is written and when the run ends, so the terminal
keeps only the script's output and the summary.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, TextIO

from sandbox.telemetry.progress import PROGRESS_AFTER_S, PROGRESS_EVERY_S, ProgressSnapshot

if TYPE_CHECKING:
    from sandbox.limits import ResolvedLimits
    from sandbox.telemetry.progress import LiveProbe


class Started(Protocol):
    """What an execution's start tells the status line (its ``on_started`` info)."""

    @property
    def limits(self) -> ResolvedLimits: ...

    @property
    def probe(self) -> LiveProbe | None: ...


__all__ = ["StatusLine", "format_status"]

_ERASE = "\r\x1b[2K"


def format_status(
    now: ProgressSnapshot, wall_time_s: float | None = None, max_tool_calls: int | None = None
) -> str:
    parts = [
        f"{now.elapsed_s:.1f}s" + (f" of {wall_time_s:g}s" if wall_time_s else ""),
        f"{now.tool_calls}"
        + (f" of {max_tool_calls}" if max_tool_calls else "")
        + (" tool call" if now.tool_calls == 1 and not max_tool_calls else " tool calls"),
    ]
    if now.cpu_time_s:
        parts.append(f"cpu {now.cpu_time_s:.2f}s")
    if now.peak_memory_bytes:
        parts.append(f"peak {now.peak_memory_bytes / (1 << 20):.1f} MiB")
    return "[ptc] " + " · ".join(parts)


class StatusLine:
    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._shown = False
        self._info: Started | None = None

    def show(self, text: str) -> None:
        self._out.write(_ERASE + text)
        self._out.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            self._out.write(_ERASE)
            self._out.flush()
            self._shown = False

    # -- embedded: the engine's probe, read by a ticker ----------------------------------------
    def started(self, info: Started) -> None:
        self._info = info

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        ticker = asyncio.get_running_loop().create_task(self._tick())
        try:
            yield
        finally:
            ticker.cancel()
            self.clear()

    async def _tick(self) -> None:
        """Shows the line once the script has run `PROGRESS_AFTER_S` (by the probe's clock,
        which starts with the script, not with the sandbox's acquisition), then every period."""
        due = PROGRESS_AFTER_S
        while True:
            info = self._info
            if info is None or info.probe is None:
                await asyncio.sleep(0.05)
                continue
            elapsed = info.probe.elapsed_s
            if elapsed >= due:
                limits = info.limits
                self.show(
                    format_status(
                        info.probe.snapshot(), limits.wall_time_ms / 1000, limits.max_tool_calls
                    )
                )
                due = elapsed + PROGRESS_EVERY_S
            await asyncio.sleep(max(0.0, due - elapsed))

    # -- through a server: its Progress events ----------------------------------------------------
    def update(self, progress: ProgressSnapshot) -> None:
        self.show(format_status(progress))
