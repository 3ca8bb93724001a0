"""The host end of the tool channel, read by a thread of its own once the guest calls a tool.

A channel built with ``on_loop`` (the process backend's) is read on the event loop until the
guest's first tool call, and only then by a thread of its own: a script that calls no tool (or
a sandbox that waits in the pool) never has a thread. Its `ready` and `end` frames and its end of
stream are a few loop callbacks, where a thread per sandbox cost a start and four cross-thread
wake-ups per execution (`sandbox.backends.process.start` has the figure). From the
first call on, the thread serves the calls as below; the switch happens between two reads, on
the loop, so frames are read by one reader at a time and in order.

Why a thread and not the event loop: a plain stub call is a synchronous round trip, and served
by asyncio every frame cost two loop turns (the transport wakes a StreamReader, which wakes the
session's task) plus the selector's bookkeeping: about 100 us of host CPU per call against a
bare socketpair round trip of 45 us. A thread that owns the reading end and answers the calls
that need no waiting (echo, mock, refusals) at once runs the same recv/send loop as that bare
round trip. Everything else (calls that wait for a handler, the guest's end report, protocol
violations) is handed to the event loop in arrival order.

Why a blocking recv() and not poll(): on these VMs a poll() wake-up across CPUs costs 20-40 us
more than a recv() wake-up (measured: 62-87 us against 43-49 us per round trip with the two
ends pinned to different CPUs), which alone would double a call's latency.

Why it spins a little: even so, a thread that sleeps between calls wakes on a cold CPU and
runs its Python slower: with the two ends on different CPUs a call answered here took 70-77 us
against 52-55 us for the same thread with no broker work, the bare round trip being 46 us. So
after answering a call at once, the thread polls without sleeping for up to `SPIN_S` (50 us),
the time in which a script calling in a loop sends its next call; then a call costs what the
bare round trip costs. Spinning is bounded three ways: only after a call it answered itself,
never again after `SPIN_MISSES` empty spins until the guest calls quickly again, and at most
`allow_spinners` threads at once (one per CPU beyond the first), so guests always keep a CPU.

Writes never block anyone: every frame goes out with a non-blocking send under one lock, in
order; what the socket cannot take waits in a backlog that the event loop flushes as the socket
becomes writable, and the thread reads no further call while the backlog is over its high-water
mark. A guest that sends calls without reading the replies therefore stalls only itself.
`close` shuts the socket down, which ends the thread's recv().
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Protocol

from sandbox import epoll_readers
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

__all__ = ["OUT_HIGH_WATER", "READY_FRAME_BYTES", "ChannelSink", "FrameChannel", "allow_spinners"]

READY_FRAME_BYTES = 4096
RECV_BYTES = 256 * 1024
LOOP_RECV_BYTES = 64 * 1024  # one read on the loop (under glibc's mmap threshold)
OUT_HIGH_WATER = 1 << 20
SPIN_S = 50e-6
SPIN_MISSES = 2  # spins in a row that found nothing before the thread stops spinning


class _Spinners:
    slots = threading.Semaphore(0)


def allow_spinners(count: int) -> None:
    """How many channel threads may spin at once (0: none). The default, one per CPU beyond
    the first, never leaves the guests without a CPU to run on."""
    _Spinners.slots = threading.Semaphore(max(0, count))


allow_spinners((os.cpu_count() or 1) - 1)


class ChannelSink(Protocol):
    """Who serves a channel's frames: the session of the execution it carries."""

    def inline(self, call: GuestCall) -> bytes | None:
        """On the channel thread: the reply to send at once, or None to `deliver` the call.
        May raise ProtocolViolation."""

    def deliver(self, message: GuestMessage | ProtocolViolation) -> None:
        """On the event loop: a call to answer later (`FrameChannel.send`), the end report, or
        the violation that ended reading."""


class FrameChannel:
    """One sandbox's channel: reading starts at once (on the loop when ``on_loop``, else in
    its thread) and waits for the guest's `ready`."""

    def __init__(self, sock: socket.socket, name: str, on_loop: bool = False) -> None:
        self._sock = sock
        self._fd = sock.fileno()
        self._name = name
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._readers = epoll_readers.for_loop(self._loop)
        self._thread: threading.Thread | None = None
        self._inbuf = bytearray()  # frames read on the loop and not yet consumed
        self._said_ready = False  # (read on the loop)
        self._reading = False  # the loop watches the socket for frames
        self._read_all = False  # the loop read the end of stream, an error or a violation
        self._called = False  # a tool call arrived: the thread takes over reading
        self._sink: ChannelSink | None = None
        self._served = threading.Event()  # after `ready`, the thread reads on only once set
        self._max_frame = READY_FRAME_BYTES
        self._closing = False
        self._lock = threading.Lock()  # guards the socket's sending side and the backlog
        self._drained = threading.Condition(self._lock)
        self._backlog = bytearray()
        self._answered_inline = False  # the last frames read got their answers at once
        self._flushing = False  # the loop watches the socket for room to write the backlog
        self._ready: asyncio.Future[GuestReady] = self._loop.create_future()
        self._closed: asyncio.Future[None] = self._loop.create_future()
        self.end_exit_code: int | None = None
        """The exit code of the well-formed `end` frame of the job being served, once one
        arrived (advisory). Each `serve` clears it: a session's cell ends with an `end` frame
        while its sandbox lives on, and a later exit of that sandbox is not that cell's."""
        self.on_end: Callable[[], None] | None = None
        """Called on the channel thread the moment a well-formed `end` frame arrives."""
        if on_loop:
            sock.setblocking(False)
            self._read_on_loop()
        else:
            self._start_thread()

    def _start_thread(self) -> None:
        self._sock.setblocking(True)
        self._thread = threading.Thread(
            target=self._run, name=f"ptc-chan-{self._name}", daemon=True
        )
        self._thread.start()

    # -- the event loop's side ----------------------------------------------------------------
    async def ready(self, timeout_s: float) -> GuestReady:
        """The guest's first frame, which must say `ready`; awaited once, by the sandbox's
        start (a timer, not `wait_for`: a few loop callbacks less per sandbox)."""
        if not self._ready.done():
            timer = self._loop.call_later(timeout_s, self._ready_timed_out, timeout_s)
            try:
                await self._ready
            finally:
                timer.cancel()
        return self._ready.result()

    def _ready_timed_out(self, timeout_s: float) -> None:
        if not self._ready.done():
            self._ready.set_exception(TimeoutError(f"the guest said nothing in {timeout_s:g} s"))

    def serve(self, sink: ChannelSink, max_frame: int) -> None:
        """Hands every further frame to ``sink``, after `ready`: a single-use run's job, or
        each cell of a session and the time between them."""
        self._max_frame = max_frame
        self._sink = sink
        self.end_exit_code = None
        self._served.set()
        if self._thread is None and not self._read_all and not self._reading:
            # Read on the loop: frames that arrived while the sandbox waited, then the rest.
            self._consume()
            if self._thread is None:
                self._read_on_loop()

    def send(self, frame: bytes) -> None:
        """Sends one whole frame after those before it; never blocks. A no-op once closed."""
        if not self._closed.done():
            self._write(frame)

    async def wait_closed(self) -> None:
        """Until the thread has stopped (end of stream, violation, error or `close`)."""
        await asyncio.shield(self._closed)

    @property
    def closed(self) -> asyncio.Future[None]:
        """`wait_closed` as a future, for done-callbacks (its exception is a host bug's).
        Never cancel it."""
        return self._closed

    async def close(self) -> None:
        """Stops the thread and closes the socket; idempotent."""
        self._closing = True
        if self._closed.done():
            # The reading side has finished and `_finish` closed the socket, or left it open
            # for a violation's kill (`_kept_for_kill`): closing it again is a no-op.
            self._sock.close()
            return
        if self._thread is not None:  # only the thread waits on these
            self._served.set()
            with self._lock:
                self._drained.notify_all()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # ends a recv() in progress
        if self._thread is None and not self._closed.done():
            self._stop_reading()  # read on the loop: nothing more to wait for
            self._post(self._finish, None)  # after the frames already handed over
        if not self._closed.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(self._closed)

    def _start_flushing(self) -> None:
        with self._lock:
            if self._flushing or not self._backlog or self._closed.done():
                return
            self._flushing = True
        self._loop.add_writer(self._fd, self._flush)

    def _flush(self) -> None:
        with self._lock:
            try:
                sent = self._sock.send(self._backlog, socket.MSG_DONTWAIT)
            except BlockingIOError:
                sent = 0
            except OSError:
                sent = len(self._backlog)  # the guest is gone: nobody will read it
            del self._backlog[:sent]
            if len(self._backlog) < OUT_HIGH_WATER:
                self._drained.notify_all()
            if self._backlog:
                return
            self._flushing = False
        self._loop.remove_writer(self._fd)

    def _finish(self, error: BaseException | None) -> None:
        if self._flushing:
            self._loop.remove_writer(self._fd)
            self._flushing = False
        if not self._kept_for_kill(error):
            self._sock.close()
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

    def _kept_for_kill(self, error: BaseException | None) -> bool:
        """Whether reading ended at a protocol violation handed to a sink, whose answer is to
        kill the sandbox: the socket then stays open until `close` (the drive's stop, after
        its kill). Closed at once, it would let a guest still writing die first of its own
        error (EPIPE, exit 1) on a loaded host, before the kill the result reports as the
        violation's action; open and unread, its writes only block until the kill."""
        return (
            isinstance(error, ProtocolViolation)
            and self._sink is not None
            and self._ready.done()
            and not self._closing
        )

    def _post(self, callback: Callable[..., object], *args: object) -> None:
        if threading.get_ident() == self._loop_thread:
            self._loop.call_soon(callback, *args)  # after what is already queued, in order
            return
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
            self._loop.call_soon_threadsafe(callback, *args)

    # -- reading on the loop (``on_loop``, until the first tool call) -------------------------
    def _read_on_loop(self) -> None:
        if self._read_all:
            return
        self._reading = True
        self._readers.watch(self._fd, self._readable)

    def _stop_reading(self, for_good: bool = True) -> None:
        self._read_all = self._read_all or for_good
        if self._reading:
            self._reading = False
            self._readers.unwatch(self._fd)

    def _readable(self) -> None:
        try:
            data = self._sock.recv(LOOP_RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._stop_reading()
            self._post(self._finish, exc)
            return
        if not data:
            self._stop_reading()
            error = None
            if self._inbuf and not self._closing:
                part = "header" if len(self._inbuf) < HEADER.size else "body"
                error = ProtocolViolation(f"channel closed inside a frame {part}")
                if self._sink is not None and self._ready.done():
                    self._post(self._sink.deliver, error)
            self._post(self._finish, error)
            return
        self._inbuf += data
        self._consume()

    def _consume(self) -> None:
        """Consumes the whole frames read on the loop; hands reading to the thread once the
        guest has called a tool, and pauses it while a sandbox waits for its job."""
        try:
            self._said_ready = self._frames(self._inbuf, self._said_ready)
        except ProtocolViolation as exc:
            self._stop_reading()
            if self._sink is not None and self._ready.done():
                self._post(self._sink.deliver, exc)
            self._post(self._finish, exc)
            return
        except BaseException as exc:  # a host bug: the session reports it, never hides it
            self._stop_reading()
            self._post(self._finish, exc)
            return
        if self._closing:
            return
        if self._called:
            self._stop_reading(for_good=False)
            self._start_thread()
        elif self._said_ready and self._sink is None:
            # An idle pooled sandbox: nothing to read until its job (its death is seen by the
            # backend's exit watch, not here). Frames already read wait with it.
            self._stop_reading(for_good=False)

    # -- either side --------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        with self._lock:
            if not self._backlog:
                try:
                    sent = self._sock.send(data, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    sent = 0
                except OSError:
                    return  # the guest is gone or the channel closed: nobody will read it
                if sent == len(data):
                    return
                data = data[sent:]
            self._backlog += data
            if self._flushing:
                return
        if threading.get_ident() != self._loop_thread:
            self._post(self._start_flushing)
        else:
            self._start_flushing()

    # -- the channel thread -------------------------------------------------------------------
    def _run(self) -> None:
        error: BaseException | None = None
        try:
            self._read_forever()
        except ProtocolViolation as exc:
            error = exc
            if self._sink is not None and self._ready.done():
                self._post(self._sink.deliver, exc)
        except BaseException as exc:  # a host bug: the session reports it, never hides it
            error = exc
        finally:
            self._post(self._finish, error)

    def _read_forever(self) -> None:
        # What the loop read before the thread took over (a part of a frame at most).
        inbuf, self._inbuf = self._inbuf, bytearray()
        self._wait_drained()
        # recv_into one buffer: recv(n) would allocate n bytes per call, and over glibc's
        # mmap threshold that is an mmap/munmap pair (with TLB shootdowns) per frame.
        chunk_buf = bytearray(RECV_BYTES)
        chunk_view = memoryview(chunk_buf)
        said_ready = self._said_ready
        misses = 0  # spins in a row that found nothing
        while not self._closing:
            if said_ready and not self._served.is_set():
                # An idle pooled sandbox: nothing to read until its job (its death is seen by
                # the backend's exit watch, not here). Frames already read wait with it.
                self._served.wait()
                said_ready = self._frames(inbuf, said_ready)
                continue
            got: int | None = None
            spinners = _Spinners.slots
            if self._answered_inline and misses < SPIN_MISSES and spinners.acquire(False):
                try:
                    got = self._spin(chunk_buf)
                finally:
                    spinners.release()
                misses = misses + 1 if got is None else 0
            self._answered_inline = False
            if got is None:
                waited_from = time.perf_counter()
                got = self._recv_waiting(chunk_buf)
                if time.perf_counter() - waited_from < SPIN_S:
                    misses = 0  # the guest calls in a tight loop again
            size = got
            if not size:
                if inbuf and not self._closing:
                    part = "header" if len(inbuf) < HEADER.size else "body"
                    raise ProtocolViolation(f"channel closed inside a frame {part}")
                return
            inbuf += chunk_view[:size]
            said_ready = self._frames(inbuf, said_ready)

    def _frames(self, inbuf: bytearray, said_ready: bool) -> bool:
        """Consumes every whole frame in ``inbuf``; returns whether `ready` has been seen."""
        offset = 0
        try:
            while len(inbuf) - offset >= HEADER.size and not self._closing:
                if said_ready and self._sink is None:
                    break  # they wait until the session serves
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
                    self._write(reply)
                    self._answered_inline = True
                    if self._thread is not None:  # never on the loop: the loop flushes
                        self._wait_drained()
        finally:
            del inbuf[:offset]
        return said_ready

    def _recv_waiting(self, buffer: bytearray) -> int:
        """A blocking read, even when the socket's file is non-blocking: uvloop's `add_writer`
        (the loop flushing a large reply's backlog) puts the file in O_NONBLOCK mode for its
        own poll handle, under the thread's feet. Then the thread waits in poll(2), which
        `close`'s shutdown wakes as it wakes a recv()."""
        while True:
            try:
                return self._sock.recv_into(buffer)
            except BlockingIOError:
                waiting = select.poll()
                waiting.register(self._fd, select.POLLIN | select.POLLPRI)
                waiting.poll()

    def _spin(self, buffer: bytearray) -> int | None:
        """Polls without sleeping for up to `SPIN_S`: the size read (0 at end of stream), or
        None when the guest sent nothing in that time."""
        deadline = time.perf_counter() + SPIN_S
        while True:
            try:
                return self._sock.recv_into(buffer, 0, socket.MSG_DONTWAIT)
            except BlockingIOError:
                if time.perf_counter() >= deadline:
                    return None

    def _wait_drained(self) -> None:
        """While the guest leaves over `OUT_HIGH_WATER` of replies unread, read no more calls."""
        with self._lock:
            while len(self._backlog) >= OUT_HIGH_WATER and not self._closing:
                self._drained.wait()

    def _handle(self, message: GuestMessage) -> bytes | None:
        sink = self._sink
        assert sink is not None
        if isinstance(message, GuestCall):
            self._called = True
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
