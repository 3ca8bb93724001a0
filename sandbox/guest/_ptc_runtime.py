"""The stub runtime: how a generated stub's call becomes a frame to the host broker.

Runs inside the sandbox (standard library only). Generated stub modules import `call`,
`acall` and the exception classes from here. A plain call sends one frame and blocks until its
answer; `acall` lets many calls be in flight at once.

Two modes, switched once and one way. Until the first async call, a plain call reads its own
answer from the socket (under a lock, so one call is in flight): no thread handoff, which on
these VMs costs two cross-CPU wake-ups per call. From the first async call on, one reader thread
receives every answer and wakes the caller it belongs to, so sync and async calls can be mixed
freely.

Frames are a 4-byte big-endian length and a UTF-8 JSON object. Nothing here is trusted by the
host: the broker re-checks every frame; this side is only the honest client.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import select
import socket
import struct
import threading
from typing import Any

__all__ = ["CallDenied", "CallRefused", "InvalidArguments", "ToolError", "acall", "call"]

_HEADER = struct.Struct(">I")
_READ_SIZE = 64 * 1024


class ToolError(Exception):
    """A tool call failed; the message says why. Subclasses say how."""

    def __init__(self, message: str, tool: str | None = None) -> None:
        super().__init__(message)
        self.tool = tool


class InvalidArguments(ToolError):
    """The arguments do not match the tool's schema; the message names the parameter."""


class CallRefused(ToolError):
    """Policy refused the call: call budget spent, a repeated failing call, an oversized call,
    or an unknown tool."""


class CallDenied(ToolError):
    """An approver denied the call."""


_ERRORS: dict[str, type[ToolError]] = {
    "error": ToolError,
    "invalid_arguments": InvalidArguments,
    "refused": CallRefused,
    "denied": CallDenied,
}


class _Waiter:
    __slots__ = ("event", "future", "loop", "reply")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop
        self.future: asyncio.Future[dict[str, Any]] | None = None
        self.event = threading.Event() if loop is None else None
        self.reply: dict[str, Any] | None = None


class Channel:
    """The guest end of the socket to the broker."""

    def __init__(self, fd: int, max_call_bytes: int) -> None:
        self._sock = socket.socket(fileno=fd)
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, _Waiter] = {}
        self._pending_lock = threading.Lock()
        self._closed: str | None = None
        self.max_call_bytes = max_call_bytes
        self._reader: threading.Thread | None = None
        self._direct = threading.Lock()  # held by a plain call in direct mode
        self._rbuf = bytearray()
        self._threaded = False
        # Session mode (see `serve_session`): frames that are not replies go here.
        self.jobs: Any = None  # a queue.SimpleQueue of `job` frames
        self.on_interrupt: Any = None  # called on the reader thread for an `interrupt` frame

    # -- framing ---------------------------------------------------------------------------
    def send(self, message: dict[str, Any]) -> None:
        self.send_bytes(json.dumps(message, separators=(",", ":")).encode())

    def send_bytes(self, body: bytes) -> None:
        with self._send_lock:
            self._sock.sendall(_HEADER.pack(len(body)) + body)

    def shut(self, linger_s: float = 0.0) -> None:
        """Ends the channel: the host reads its end (what was sent stays readable). Unlike a
        close, it does not wait for every descriptor of the socket to go. With ``linger_s``
        it then waits, that long at most, for the host to close its side, which the host
        does once it has read the end and measured the sandbox: a process that exited at
        once took the CPU time of the children it reaped with it (the host's sums read it
        from this process's own /proc entry), and a loaded host read too late lost it. A
        thread blocked reading the channel wakes when the host closes it (or at our exit)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR if linger_s > 0 else socket.SHUT_RDWR)
            if linger_s > 0:
                poller = select.poll()
                poller.register(self._sock.fileno(), select.POLLRDHUP)
                poller.poll(int(linger_s * 1000))

    def _fill(self, n: int) -> None:
        """Reads until the buffer holds ``n`` bytes; one read usually brings a whole frame."""
        while len(self._rbuf) < n:
            chunk = self._sock.recv(max(n - len(self._rbuf), _READ_SIZE))
            if not chunk:
                raise EOFError("the host closed the channel")
            self._rbuf += chunk

    def recv(self) -> dict[str, Any]:
        """The next frame; only one reader at a time (the direct caller or the reader thread)."""
        self._fill(_HEADER.size)
        (length,) = _HEADER.unpack_from(self._rbuf)
        end = _HEADER.size + length
        self._fill(end)
        body = bytes(self._rbuf[_HEADER.size : end])
        del self._rbuf[:end]
        message = json.loads(body)
        if not isinstance(message, dict):
            raise ValueError("frame is not an object")
        return message

    # -- calls -----------------------------------------------------------------------------
    def _ensure_reader(self) -> None:
        """Switches to threaded mode (once): waits for a direct call in flight to finish."""
        if self._threaded:
            return
        with self._direct:
            if not self._threaded:
                self._reader = threading.Thread(
                    target=self._read_loop, name="ptc-channel", daemon=True
                )
                self._reader.start()
                self._threaded = True

    def _read_loop(self) -> None:
        try:
            while True:
                reply = self.recv()
                kind = reply.get("t")
                if kind == "job" and self.jobs is not None:
                    self.jobs.put(reply)
                    continue
                if kind == "interrupt" and self.on_interrupt is not None:
                    self.on_interrupt()
                    continue
                with self._pending_lock:
                    waiter = self._pending.pop(reply.get("id"), None)  # type: ignore[arg-type]
                if waiter is not None:
                    self._wake(waiter, reply)
        except (EOFError, OSError, ValueError) as exc:
            self._fail_all(f"tool channel closed: {exc}")
            if self.jobs is not None:
                self.jobs.put({"t": "closed"})

    def serve_session(self, jobs: Any, on_interrupt: Any) -> None:
        """Session mode: one reader thread from now on, which also hands the host's next `job`
        frames to ``jobs`` and calls ``on_interrupt`` for an `interrupt` frame."""
        self.jobs, self.on_interrupt = jobs, on_interrupt
        self._ensure_reader()

    def _wake(self, waiter: _Waiter, reply: dict[str, Any]) -> None:
        waiter.reply = reply
        if waiter.event is not None:
            waiter.event.set()
        elif waiter.loop is not None and waiter.future is not None:
            future = waiter.future
            # RuntimeError: the loop is closed, so nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                waiter.loop.call_soon_threadsafe(_resolve, future, reply)

    def _fail_all(self, reason: str) -> None:
        with self._pending_lock:
            self._closed = reason
            waiters = list(self._pending.values())
            self._pending.clear()
        for waiter in waiters:
            self._wake(waiter, {"ok": False, "kind": "error", "message": reason})

    def _frame(self, tool: str, arguments: Any, call_id: int) -> bytes:
        if not isinstance(tool, str):
            raise TypeError("tool name must be a string")
        if not isinstance(arguments, dict):
            raise InvalidArguments("arguments must be passed as keywords", tool)
        try:
            args_json = json.dumps(arguments, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidArguments(f"arguments are not JSON-serializable: {exc}", tool) from None
        if len(args_json) > self.max_call_bytes:
            # Announce the oversized call without its arguments: the host records and refuses it.
            header = {"t": "call", "id": call_id, "tool": tool, "oversized": len(args_json)}
            return json.dumps(header, separators=(",", ":")).encode()
        tool_json = json.dumps(tool)
        return f'{{"t":"call","id":{call_id},"tool":{tool_json},"args":{args_json}}}'.encode()

    def _register(self, waiter: _Waiter) -> int:
        call_id = next(self._ids)
        with self._pending_lock:
            if self._closed is not None:
                raise ToolError(self._closed)
            self._pending[call_id] = waiter
        return call_id

    def _send_call(self, tool: str, arguments: Any, call_id: int) -> None:
        try:
            self.send_bytes(self._frame(tool, arguments, call_id))
        except BaseException as exc:
            with self._pending_lock:
                self._pending.pop(call_id, None)
            if isinstance(exc, OSError):
                # A dead channel is a failed call, in the exception type stubs document.
                raise ToolError(f"tool channel closed: {exc}", tool) from None
            raise

    def _direct_call(self, tool: str, arguments: dict[str, Any]) -> Any:
        """One call, answer read by the caller itself; the lock keeps one call in flight."""
        if self._closed is not None:
            raise ToolError(self._closed, tool)
        call_id = next(self._ids)
        frame = self._frame(tool, arguments, call_id)
        try:
            self.send_bytes(frame)
            reply = self.recv()
            # Answers nobody waits for (frames written to the socket behind the runtime's back)
            # are skipped, as the reader thread skips them.
            while reply.get("id") != call_id:
                reply = self.recv()
        except (EOFError, OSError, ValueError) as exc:
            self._closed = f"tool channel closed: {exc}"
            raise ToolError(self._closed, tool) from None
        return _outcome(tool, reply)

    def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        if not self._threaded:
            with self._direct:
                if not self._threaded:
                    return self._direct_call(tool, arguments)
        waiter = _Waiter()
        self._send_call(tool, arguments, self._register(waiter))
        assert waiter.event is not None
        waiter.event.wait()
        return _outcome(tool, waiter.reply)

    async def acall(self, tool: str, arguments: dict[str, Any]) -> Any:
        self._ensure_reader()
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop)
        waiter.future = loop.create_future()
        self._send_call(tool, arguments, self._register(waiter))
        return _outcome(tool, await waiter.future)


def _resolve(future: asyncio.Future[dict[str, Any]], reply: dict[str, Any]) -> None:
    if not future.done():
        future.set_result(reply)


def _outcome(tool: str, reply: dict[str, Any] | None) -> Any:
    if reply is None:
        raise ToolError("no answer from the host", tool)
    if reply.get("ok"):
        return reply.get("value")
    error = _ERRORS.get(str(reply.get("kind")), ToolError)
    raise error(str(reply.get("message", "tool call failed")), tool)


_channel: Channel | None = None


def install(channel: Channel) -> None:
    """Called once by the bootstrap, before the script runs."""
    global _channel  # noqa: PLW0603
    _channel = channel


def _require() -> Channel:
    if _channel is None:
        raise ToolError("the tool runtime is not connected (running outside the sandbox?)")
    return _channel


def call(tool: str, arguments: dict[str, Any]) -> Any:
    """Calls ``tool`` with ``arguments`` and blocks until the host answers."""
    return _require().call(tool, arguments)


async def acall(tool: str, arguments: dict[str, Any]) -> Any:
    """Calls ``tool`` without blocking the event loop; gather many for fan-out."""
    return await _require().acall(tool, arguments)
