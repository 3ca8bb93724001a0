"""Live progress of a running execution: what a status line or a progress event shows.

`Engine.run` hands a `LiveProbe` to its ``on_started`` callback (`StartedInfo.probe`); whoever
shows progress (`ptc run`'s status line, `ExecuteStream`'s `Progress` events, the MCP execute
tool's progress notifications) reads it now and then. Every figure is the host's: its clock, the
broker's call count, the sandbox's cgroup accounting (zeros where none is read).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "PROGRESS_AFTER_S",
    "PROGRESS_EVERY_S",
    "CallCounter",
    "LiveProbe",
    "ProgressSnapshot",
    "UsageSource",
]

# Executions shorter than this show no progress at all; longer ones, one update per period.
PROGRESS_AFTER_S = 1.0
PROGRESS_EVERY_S = 1.0


@dataclass(frozen=True)
class ProgressSnapshot:
    elapsed_s: float
    tool_calls: int
    cpu_time_s: float = 0.0
    peak_memory_bytes: int = 0
    stdout_bytes: int = 0
    stderr_bytes: int = 0


class _Usage(Protocol):
    @property
    def cpu_time_s(self) -> float: ...

    @property
    def peak_memory_bytes(self) -> int: ...


class UsageSource(Protocol):
    """What accounts for the sandbox (a sandbox handle): its usage now."""

    def usage(self) -> _Usage: ...


class CallCounter(Protocol):
    """What counts the execution's tool calls (its broker)."""

    @property
    def call_count(self) -> int: ...


class LiveProbe:
    """Reads how far one execution has got; safe to call from the event loop at any time."""

    def __init__(self, handle: UsageSource | None = None) -> None:
        self._t0 = time.monotonic()
        self._handle = handle
        self.broker: CallCounter | None = None

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self._t0

    def snapshot(self, stdout_bytes: int = 0, stderr_bytes: int = 0) -> ProgressSnapshot:
        cpu, peak = 0.0, 0
        if self._handle is not None:
            try:
                usage = self._handle.usage()
                cpu, peak = usage.cpu_time_s, usage.peak_memory_bytes
            except Exception:  # the sandbox is gone already: no figures, not an error
                cpu, peak = 0.0, 0
        return ProgressSnapshot(
            elapsed_s=time.monotonic() - self._t0,
            tool_calls=self.broker.call_count if self.broker is not None else 0,
            cpu_time_s=cpu,
            peak_memory_bytes=peak,
            stdout_bytes=stdout_bytes,
            stderr_bytes=stderr_bytes,
        )
