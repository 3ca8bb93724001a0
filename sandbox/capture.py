"""Capped capture of a sandbox's stdout and stderr.

The host reads the pipes itself, keeps the first `limit` bytes and counts the rest: nothing is
cut silently, the rendered text ends with a marker naming the bytes dropped. Reading continues
past the cap so that the script never blocks on a full pipe; the wall-time limit bounds a flood.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from sandbox import epoll_readers

__all__ = ["CappedOutput", "OutputCallback", "OutputStream"]

OutputCallback = Callable[[str, bytes], None]
_CHUNK = 64 * 1024
CATCH_UP_BYTES = 1 << 20


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


class OutputStream(asyncio.Protocol):
    """One output pipe or socket of a sandbox, read by the event loop as data arrives.

    A protocol rather than a StreamReader drained by a task: every chunk reaches the sink in
    the very callback that read it, with no buffer in between, so `catch_up` can take what the
    kernel holds right now. The session calls it before a tool call's request leaves, which
    keeps output written before the call ahead of the call, although calls arrive on the
    channel's own thread.
    """

    _readers: epoll_readers.EpollReaders  # set by `from_fd` only: transport-fed streams need none

    def __init__(self) -> None:
        self._sink: CappedOutput | None = None
        self._on_output: OutputCallback | None = None
        self._early: list[bytes] = []  # before `attach`: the bootstrap's own words, if any
        self._detached = False
        self._fd = -1
        self._transport: asyncio.BaseTransport | None = None
        self._loop = asyncio.get_running_loop()
        self._owned = False  # `from_fd`: the stream reads (and closes) the descriptor itself
        self.closed: asyncio.Future[None] = self._loop.create_future()

    @classmethod
    def from_fd(cls, fd: int) -> OutputStream:
        """A stream that reads pipe ``fd`` straight from the loop's epoll readers
        (`sandbox.epoll_readers`), and owns it (`close` closes it). No transport:
        setting one up and tearing it down cost a dozen loop callbacks per pipe, twice per
        sandbox (`bench.host_profile`)."""
        stream = cls()
        os.set_blocking(fd, False)
        stream._fd, stream._owned = fd, True
        stream._readers = epoll_readers.for_loop(stream._loop)
        stream._readers.watch(fd, stream._readable)
        return stream

    def _readable(self) -> None:
        try:
            data = os.read(self._fd, _CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""  # a read error ends the stream as its end of file does
        if data:
            self.data_received(data)
        else:
            self._readers.unwatch(self._fd)
            self._end()

    def close(self) -> None:
        """Stops reading and closes an owned descriptor (`from_fd`); idempotent."""
        if self._owned and self._fd >= 0:
            if not self.closed.done():
                self._readers.unwatch(self._fd)
            os.close(self._fd)
            self._fd = -1
        self._end()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        source = transport.get_extra_info("pipe") or transport.get_extra_info("socket")
        self._fd = source.fileno() if source is not None else -1

    def data_received(self, data: bytes) -> None:
        if self._sink is None:
            if not self._detached:
                self._early.append(data)
            return
        kept = self._sink.feed(data)
        if kept and self._on_output is not None:
            self._on_output(self._sink.name, kept)

    def eof_received(self) -> bool:
        self._end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()

    def _end(self) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def attach(self, sink: CappedOutput, on_output: OutputCallback | None) -> None:
        """From now on output goes to ``sink`` (and ``on_output``), starting with any early."""
        self._sink, self._on_output = sink, on_output
        early, self._early = self._early, []
        for chunk in early:
            self.data_received(chunk)

    def detach(self) -> None:
        """The execution's output is final: later bytes (after its end) are not its own."""
        self._sink, self._on_output, self._detached = None, None, True

    def catch_up(self) -> None:
        """Reads what the kernel already holds, up to `CATCH_UP_BYTES` (a flood from many
        processes could otherwise hold the event loop here)."""
        transport = self._transport
        if self._fd < 0 or self.closed.done():
            return
        if not self._owned and (transport is None or transport.is_closing()):
            return
        taken = 0
        while taken < CATCH_UP_BYTES:
            try:
                chunk = os.read(self._fd, _CHUNK)
            except OSError:  # BlockingIOError: nothing more now
                return
            if not chunk:
                return  # end of file: the selector (or transport) sees it too and ends it
            taken += len(chunk)
            self.data_received(chunk)
            if len(chunk) < _CHUNK:
                return
