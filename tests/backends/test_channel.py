"""The channel thread on a real socketpair, the test playing the guest's end; and the same
channel read on the event loop until the guest's first call (``on_loop``, the process
backend's).

What the engine tests cannot pin down exactly: frames are answered inline or handed to the
loop in arrival order, replies from both never interleave, a guest that stops reading stalls
only its own channel (never the event loop), caps hold before and after `ready`, and closing
leaves no thread and no open socket behind.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Coroutine
from functools import wraps
from typing import Any

import pytest

from sandbox.backends.channel import OUT_HIGH_WATER, FrameChannel
from sandbox.protocol import GuestCall, GuestEnd, GuestMessage, ProtocolViolation, encode_frame

HEADER = struct.Struct(">I")


def in_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Runs an async test in a fresh event loop (the suite has no asyncio plugin)."""

    @wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


def frame(obj: dict[str, Any]) -> bytes:
    return encode_frame(obj)


def call(i: int, **args: Any) -> bytes:
    return frame({"t": "call", "id": i, "tool": "t", "args": args})


def read_frame(sock: socket.socket) -> dict[str, Any]:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "the host closed the channel"
            data += chunk
        return data

    (length,) = HEADER.unpack(exactly(HEADER.size))
    value: dict[str, Any] = json.loads(exactly(length))
    return value


class Sink:
    """Answers odd call ids inline with a reply of `pad` bytes; even ids go to the loop."""

    def __init__(self, pad: int = 0) -> None:
        self.pad = pad
        self.inline_calls: list[int] = []
        self.inline_threads: set[str] = set()
        self.delivered: list[GuestMessage | ProtocolViolation] = []
        self.got = asyncio.Event()

    def inline(self, message: GuestCall) -> bytes | None:
        self.inline_calls.append(message.id)
        self.inline_threads.add(threading.current_thread().name)
        if message.id % 2:
            return frame({"t": "result", "id": message.id, "ok": True, "value": "x" * self.pad})
        return None

    def deliver(self, message: GuestMessage | ProtocolViolation) -> None:
        self.delivered.append(message)
        self.got.set()


async def until(predicate: Any, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


async def opened(name: str, on_loop: bool = False) -> tuple[FrameChannel, socket.socket]:
    host, guest = socket.socketpair()
    channel = FrameChannel(host, name, on_loop=on_loop)
    guest.sendall(frame({"t": "ready", "pid": 7}))
    ready = await channel.ready(5)
    assert ready.pid == 7
    return channel, guest


@in_loop
async def test_inline_and_loop_replies_in_arrival_order() -> None:
    channel, guest = await opened("order")
    sink = Sink()
    channel.serve(sink, 1 << 16)
    guest.sendall(call(1) + call(2) + call(3))
    await until(lambda: len(sink.delivered) == 1, "call 2 handed to the loop")
    (handed,) = sink.delivered
    assert isinstance(handed, GuestCall) and handed.id == 2
    assert sink.inline_calls == [1, 2, 3]
    assert sink.inline_threads == {"ptc-chan-order"}
    channel.send(frame({"t": "result", "id": 2, "ok": True, "value": "late"}))
    replies = [await asyncio.to_thread(read_frame, guest) for _ in range(3)]
    assert [(r["id"], r["value"]) for r in replies] == [(1, ""), (3, ""), (2, "late")]
    guest.sendall(frame({"t": "end", "status": "ok", "exit_code": 3, "error": None}))
    guest.close()
    await channel.wait_closed()
    assert channel.end_exit_code == 3
    assert isinstance(sink.delivered[-1], GuestEnd)
    await channel.close()


@in_loop
async def test_a_guest_that_stops_reading_stalls_only_its_channel() -> None:
    channel, guest = await opened("stall")
    pad = 64 * 1024
    sink = Sink(pad=pad)
    channel.serve(sink, 1 << 16)
    n = 101  # odd ids are answered inline: 51 replies of 64 KiB, over the high-water mark
    guest.sendall(b"".join(call(i) for i in range(1, n + 1)))
    # The loop keeps running while the thread waits for the guest to read.
    stable_since, seen = time.monotonic(), -1
    while time.monotonic() - stable_since < 0.3:
        await asyncio.sleep(0.01)
        if len(sink.inline_calls) != seen:
            seen, stable_since = len(sink.inline_calls), time.monotonic()
    assert seen < n, "the thread kept reading although nobody read its replies"
    assert seen * pad > OUT_HIGH_WATER // 2
    replies = []
    for _ in range((n + 1) // 2):
        replies.append(await asyncio.to_thread(read_frame, guest))
    assert [r["id"] for r in replies] == list(range(1, n + 1, 2))
    assert sink.inline_calls == list(range(1, n + 1))
    guest.close()
    await channel.close()


@pytest.mark.parametrize(
    ("served", "size", "message"),
    [
        (False, 5000, "frame of 5000 bytes is over the 4096-byte cap"),
        (True, 70000, "frame of 70000 bytes is over the 65536-byte cap"),
    ],
)
@pytest.mark.parametrize("on_loop", [False, True], ids=["thread", "on_loop"])
@in_loop
async def test_frame_caps_before_and_after_ready(
    served: bool, size: int, message: str, on_loop: bool
) -> None:
    host, guest = socket.socketpair()
    channel = FrameChannel(host, "caps", on_loop=on_loop)
    sink = Sink()
    if served:
        guest.sendall(frame({"t": "ready", "pid": 7}))
        await channel.ready(5)
        channel.serve(sink, 1 << 16)
    guest.sendall(HEADER.pack(size))
    if served:
        await channel.wait_closed()
        assert [str(m) for m in sink.delivered] == [message]
    else:
        with pytest.raises(ProtocolViolation, match=message):
            await channel.ready(5)
    await channel.close()
    assert guest.recv(1) == b""  # the host's end is closed
    guest.close()


@pytest.mark.parametrize("on_loop", [False, True], ids=["thread", "on_loop"])
@in_loop
async def test_frames_before_ready_must_be_ready(on_loop: bool) -> None:
    host, guest = socket.socketpair()
    channel = FrameChannel(host, "first", on_loop=on_loop)
    guest.sendall(call(1))
    with pytest.raises(ProtocolViolation, match="the guest did not say ready"):
        await channel.ready(5)
    await channel.close()
    guest.close()


@in_loop
async def test_a_second_ready_is_a_violation() -> None:
    channel, guest = await opened("again")
    sink = Sink()
    channel.serve(sink, 1 << 16)
    guest.sendall(frame({"t": "ready", "pid": 8}))
    await channel.wait_closed()
    assert [str(m) for m in sink.delivered] == ["unexpected ready frame after the job was sent"]
    await channel.close()
    guest.close()


@in_loop
async def test_close_stops_the_thread_of_an_idle_channel() -> None:
    before = {t.name for t in threading.enumerate()}
    channel, guest = await opened("idle")
    assert "ptc-chan-idle" in {t.name for t in threading.enumerate()}
    await channel.close()
    await channel.close()  # idempotent
    # The thread reported its end; it may take a moment more to be gone.
    await until(lambda: {t.name for t in threading.enumerate()} <= before, "the thread to end")
    channel.send(call(1))  # after close: dropped, no error
    assert guest.recv(1) == b""
    guest.close()


@pytest.mark.parametrize("on_loop", [False, True], ids=["thread", "on_loop"])
@in_loop
async def test_frames_sent_before_serve_are_served_in_order(on_loop: bool) -> None:
    host, guest = socket.socketpair()
    channel = FrameChannel(host, "early", on_loop=on_loop)
    guest.sendall(frame({"t": "ready", "pid": 7}) + call(1))
    await channel.ready(5)
    guest.sendall(call(3))
    await asyncio.sleep(0.05)  # nothing is read until the session serves
    sink = Sink()
    channel.serve(sink, 1 << 16)
    replies = [await asyncio.to_thread(read_frame, guest) for _ in range(2)]
    assert [r["id"] for r in replies] == [1, 3]
    guest.close()
    await channel.close()


def channel_threads(name: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == f"ptc-chan-{name}"]


@in_loop
async def test_on_loop_a_run_without_calls_never_has_a_thread() -> None:
    channel, guest = await opened("nocall", on_loop=True)
    assert channel_threads("nocall") == []
    sink = Sink()
    channel.serve(sink, 1 << 16)
    guest.sendall(frame({"t": "end", "status": "ok", "exit_code": 4, "error": None}))
    guest.close()
    await channel.wait_closed()
    assert channel.end_exit_code == 4
    assert [type(m) for m in sink.delivered] == [GuestEnd]
    assert channel_threads("nocall") == []
    await channel.close()


@in_loop
async def test_on_loop_the_first_call_hands_reading_to_the_thread() -> None:
    channel, guest = await opened("handover", on_loop=True)
    sink = Sink()
    channel.serve(sink, 1 << 16)
    guest.sendall(call(1) + call(2))
    await until(lambda: len(sink.delivered) == 1, "call 2 handed to the loop")
    assert sink.inline_threads == {threading.current_thread().name}  # read on the loop
    assert channel_threads("handover") == ["ptc-chan-handover"]  # from now on, the thread
    guest.sendall(call(3))
    await until(lambda: len(sink.inline_calls) == 3, "call 3 read by the thread")
    assert sink.inline_threads == {threading.current_thread().name, "ptc-chan-handover"}
    channel.send(frame({"t": "result", "id": 2, "ok": True, "value": "late"}))
    replies = [await asyncio.to_thread(read_frame, guest) for _ in range(3)]
    assert [(r["id"], r["value"]) for r in replies] == [(1, ""), (3, ""), (2, "late")]
    guest.sendall(frame({"t": "end", "status": "ok", "exit_code": 0, "error": None}))
    guest.close()
    await channel.wait_closed()
    assert isinstance(sink.delivered[-1], GuestEnd)
    await channel.close()


@in_loop
async def test_on_loop_close_of_an_idle_channel() -> None:
    channel, guest = await opened("idle-loop", on_loop=True)
    await channel.close()
    await channel.close()  # idempotent
    assert channel_threads("idle-loop") == []
    channel.send(call(1))  # after close: dropped, no error
    assert guest.recv(1) == b""
    guest.close()


@in_loop
async def test_on_loop_a_frame_cut_by_the_end_of_stream_is_a_violation() -> None:
    channel, guest = await opened("cut", on_loop=True)
    sink = Sink()
    channel.serve(sink, 1 << 16)
    guest.sendall(HEADER.pack(10) + b"{")
    guest.close()
    await channel.wait_closed()
    assert [str(m) for m in sink.delivered] == ["channel closed inside a frame body"]
    await channel.close()


@pytest.mark.parametrize("on_loop", [False, True], ids=["thread", "on_loop"])
@in_loop
async def test_a_violation_leaves_the_socket_open_until_close(on_loop: bool) -> None:
    """The sink's answer to a violation is a kill, which the drive's stop follows with
    `close`: until then the guest's writes must not fail (closed at the violation, a guest
    still writing died of EPIPE with exit code 1 on a loaded host before the kill came, and the
    result said `killed` with the guest's own exit code)."""
    channel, guest = await opened(f"kept-{on_loop}", on_loop=on_loop)
    sink = Sink()
    channel.serve(sink, 1 << 16)
    guest.sendall(HEADER.pack(5) + b"hello")
    await channel.wait_closed()
    assert [str(m) for m in sink.delivered] == [
        "frame is not UTF-8 JSON: Expecting value: line 1 column 1 (char 0)"
    ]
    guest.setblocking(False)
    assert guest.send(b"garbage after the violation") == len(b"garbage after the violation")
    await channel.close()
    with pytest.raises(BrokenPipeError):  # the host's end is closed now
        for _ in range(1000):
            guest.send(b"x" * 4096)
    guest.close()
