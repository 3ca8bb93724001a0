"""The host end of the tool channel, served by a thread of its own.

Why a thread and not the event loop: a plain stub call is a synchronous round trip, and served
by asyncio every frame cost two loop turns (the transport wakes a StreamReader, which wakes the
session's task) plus the selector's bookkeeping: about 100 us of host CPU per call against a
bare socketpair round trip of 45 us. A thread that owns the socket and answers the calls that
need no waiting (echo, mock, refusals) at once runs the same poll/recv/send loop as that bare
round trip. Everything else (calls that wait for a handler, the guest's end report, protocol
violations) is handed to the event loop in arrival order.

The thread blocks only in poll(): the socket is non-blocking, replies queue in an output buffer
that drains as the socket becomes writable, and reading pauses while that buffer is over its
high-water mark, so a guest that sends calls without reading the replies stalls only itself.
The loop wakes the thread through an eventfd (a reply from a handler, serving, closing).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import select
import socket
import threading
from collections.abc import Callable
from typing import Protocol

from sandbox.protocol import (
    HEADER,
    GuestCall,
    GuestEnd,
    GuestMessage,
    GuestReady,
    ProtocolViolation,
    decode_body,
    parse_guest_message,
)

__all__ = ["READY_FRAME_BYTES", "ChannelSink", "FrameChannel"]

READY_FRAME_BYTES = 4096
RECV_BYTES = 256 * 1024
OUT_HIGH_WATER = 1 << 20


class ChannelSink(Protocol):
    """Who serves a channel's frames: the session of the execution it carries."""

    def inline(self, call: GuestCall) -> bytes | None:
        """On the channel thread: the reply to send at once, or None to `deliver` the call.
        May raise ProtocolViolation."""

    def deliver(self, message: GuestMessage | ProtocolViolation) -> None:
        """On the event loop: a call to answer later (`FrameChannel.send`), the end report, or
        the violation that ended reading."""


class FrameChannel:
    """One sandbox's channel: the thread starts at once and waits for the guest's `ready`."""

    def __init__(self, sock: socket.socket, name: str) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._outbox: collections.deque[bytes] = collections.deque()
        self._sink: ChannelSink | None = None
        self._max_frame = READY_FRAME_BYTES
        self._closing = False
        self._ready: asyncio.Future[GuestReady] = self._loop.create_future()
        self._closed: asyncio.Future[None] = self._loop.create_future()
        self._wake_closed = False
        self.end_exit_code: int | None = None
        """The exit code of the guest's well-formed `end` frame, once one arrived (advisory)."""
        self.on_end: Callable[[], None] | None = None
        """Called on the channel thread the moment a well-formed `end` frame arrives."""
        sock.setblocking(False)
        self._thread = threading.Thread(target=self._run, name=f"ptc-chan-{name}", daemon=True)
        self._thread.start()

    # -- the event loop's side ----------------------------------------------------------------
    async def ready(self, timeout_s: float) -> GuestReady:
        """The guest's first frame, which must say `ready`."""
        return await asyncio.wait_for(asyncio.shield(self._ready), timeout_s)

    def serve(self, sink: ChannelSink, max_frame: int) -> None:
        """Hands every further frame to ``sink``; call once, after `ready`."""
        self._max_frame = max_frame
        self._sink = sink
        self._poke()

    def send(self, frame: bytes) -> None:
        """Queues one whole frame for the guest; frames never interleave. A no-op once closed."""
        if self._closed.done():
            return
        self._outbox.append(frame)
        self._poke()

    async def wait_closed(self) -> None:
        """Until the thread has stopped (end of stream, violation, error or `close`)."""
        await asyncio.shield(self._closed)

    async def close(self) -> None:
        """Stops the thread, closes the socket; idempotent."""
        self._closing = True
        self._poke()
        with contextlib.suppress(Exception):
            await asyncio.shield(self._closed)
        if not self._wake_closed:
            self._wake_closed = True
            os.close(self._wake)

    def _poke(self) -> None:
        if not self._wake_closed:
            with contextlib.suppress(OSError):
                os.eventfd_write(self._wake, 1)

    def _finish(self, error: BaseException | None) -> None:
        if not self._ready.done():
            self._ready.set_exception(
                error or ProtocolViolation("the channel closed before the guest said ready")
            )
            self._ready.exception()  # retrieved: nobody may be waiting any more
        if not self._closed.done():
            if error is None or isinstance(error, ProtocolViolation | OSError):
                self._closed.set_result(None)
            else:
                self._closed.set_exception(error)

    def _post(self, callback: Callable[..., object], *args: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
            self._loop.call_soon_threadsafe(callback, *args)

    # -- the channel thread -------------------------------------------------------------------
    def _run(self) -> None:
        error: BaseException | None = None
        try:
            self._serve_forever()
        except ProtocolViolation as exc:
            error = exc
            if self._sink is not None and self._ready.done():
                self._post(self._sink.deliver, exc)
        except BaseException as exc:  # a host bug: the session reports it, never hides it
            error = exc
        finally:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            self._post(self._finish, error)

    def _serve_forever(self) -> None:
        sock = self._sock
        poller = select.poll()
        poller.register(self._wake, select.POLLIN)
        inbuf = bytearray()
        out = bytearray()
        said_ready = False
        while True:
            reading = len(out) < OUT_HIGH_WATER and (not said_ready or self._sink is not None)
            poller.register(
                sock, (select.POLLIN if reading else 0) | (select.POLLOUT if out else 0)
            )
            hung_up = False
            for fd, events in poller.poll():
                if fd == self._wake:
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(self._wake)
                elif events & (select.POLLHUP | select.POLLERR | select.POLLNVAL) and not reading:
                    # Reported even unasked, so it must end the wait or the thread would spin.
                    if self._sink is None or events & select.POLLNVAL:
                        hung_up = True
                    else:
                        out.clear()  # the guest is gone: read what it sent, drop the replies
            if self._closing or hung_up:
                return
            while self._outbox:
                out += self._outbox.popleft()
            if reading:
                try:
                    chunk = sock.recv(RECV_BYTES)
                except BlockingIOError:
                    chunk = None
                if chunk == b"":
                    if inbuf:
                        part = "header" if len(inbuf) < HEADER.size else "body"
                        raise ProtocolViolation(f"channel closed inside a frame {part}")
                    return
                if chunk:
                    inbuf += chunk
            if inbuf:  # also frames that waited for `serve`
                said_ready = self._frames(inbuf, out, said_ready)
            if out:
                try:
                    sent = sock.send(out)
                except BlockingIOError:
                    sent = 0
                del out[:sent]

    def _frames(self, inbuf: bytearray, out: bytearray, said_ready: bool) -> bool:
        """Consumes every whole frame in ``inbuf``; returns whether `ready` has been seen."""
        offset = 0
        try:
            while len(inbuf) - offset >= HEADER.size:
                if said_ready and self._sink is None:
                    break  # frames before the job: they wait until the session serves
                if len(out) >= OUT_HIGH_WATER:
                    break  # the guest is not reading its replies: no more calls until it does
                (length,) = HEADER.unpack_from(inbuf, offset)
                limit = self._max_frame if said_ready else READY_FRAME_BYTES
                if length > limit:
                    raise ProtocolViolation(f"frame of {length} bytes is over the {limit}-byte cap")
                end = offset + HEADER.size + length
                if len(inbuf) < end:
                    break
                message = parse_guest_message(decode_body(inbuf[offset + HEADER.size : end]))
                offset = end
                if not said_ready:
                    if not isinstance(message, GuestReady):
                        raise ProtocolViolation("the guest did not say ready")
                    said_ready = True
                    self._post(_resolve, self._ready, message)
                    continue
                reply = self._handle(message)
                if reply is not None:
                    out += reply
        finally:
            del inbuf[:offset]
        return said_ready

    def _handle(self, message: GuestMessage) -> bytes | None:
        sink = self._sink
        assert sink is not None
        if isinstance(message, GuestCall):
            reply = sink.inline(message)
            if reply is not None:
                return reply
        elif isinstance(message, GuestReady):
            raise ProtocolViolation("unexpected ready frame after the job was sent")
        elif isinstance(message, GuestEnd):
            self.end_exit_code = message.exit_code
            if self.on_end is not None:
                self.on_end()
        self._post(sink.deliver, message)
        return None


def _resolve(future: asyncio.Future[GuestReady], ready: GuestReady) -> None:
    if not future.done():
        future.set_result(ready)
