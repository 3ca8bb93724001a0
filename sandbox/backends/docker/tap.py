"""A channel reader that notices the guest's `end` frame as its bytes arrive.

The engine learns that a container exited 25-35 ms after the fact, too late for a warm-pool
execution that should take a few milliseconds. The backend instead watches the container's init
process with a pidfd and takes the exit code from the guest's own `end` frame, which this
reader spots while feeding the session exactly the bytes it received (the session does all the
real parsing and validation). When no well-formed end frame arrived, the backend asks the engine.
The moment the frame arrives, the container is still alive, so `on_end` can snapshot its cgroup
counters (OOM kills, pids-limit hits) before the engine removes the cgroup.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from typing import SupportsIndex

__all__ = ["EndFrameTap"]

_HEADER = 4
_MAX_END_FRAME = 8192  # an end frame carries at most a 2000-char message


class EndFrameTap(asyncio.StreamReader):
    def __init__(self, limit: int) -> None:
        super().__init__(limit=limit)
        self.end_exit_code: int | None = None
        self.on_end: Callable[[], None] | None = None
        self._header = bytearray()
        self._need = 0  # body bytes still to come of the current frame
        self._body: bytearray | None = None  # kept only for frames small enough to be `end`

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        chunk = data if isinstance(data, bytes | bytearray) else bytes(data)
        self._scan(memoryview(chunk))
        super().feed_data(chunk)

    def _scan(self, data: memoryview) -> None:
        while data:
            if self._need == 0:
                take = min(_HEADER - len(self._header), len(data))
                self._header += data[:take]
                data = data[take:]
                if len(self._header) < _HEADER:
                    return
                self._need = int.from_bytes(self._header, "big")
                self._header.clear()
                self._body = bytearray() if self._need <= _MAX_END_FRAME else None
                if self._need == 0:
                    continue
            take = min(self._need, len(data))
            if self._body is not None:
                self._body += data[:take]
            data = data[take:]
            self._need -= take
            if self._need == 0 and self._body is not None:
                self._frame(bytes(self._body))
                self._body = None

    def _frame(self, body: bytes) -> None:
        if b'"end"' not in body:
            return
        try:
            message = json.loads(body)
        except ValueError:
            return
        if not isinstance(message, dict) or message.get("t") != "end":
            return
        code = message.get("exit_code")
        if isinstance(code, int) and not isinstance(code, bool) and 0 <= code <= 255:
            self.end_exit_code = code
            if self.on_end is not None:
                self.on_end()
