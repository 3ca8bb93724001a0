"""The host end of a container's channel and output streams: unix sockets in a bind mount.

Each container gets its own host directory, bind-mounted read-only at `/run/ptc`, in which the
host listens on `stdout.sock`, `stderr.sock` and `chan.sock` before the container starts; the
guest bootstrap (`--connect /run/ptc`) connects to all three and makes the first two its stdout
and stderr. The host therefore reads the script's output and frames directly from sockets, with
kernel backpressure, exactly as it reads the process backend's pipes, and nothing goes through
the engine's attach or log machinery. Each listener accepts one connection and is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from sandbox.backends.channel import FrameChannel
from sandbox.capture import OutputStream

__all__ = ["GUEST_MOUNT", "Connected", "HostSockets"]

GUEST_MOUNT = "/run/ptc"
SOCKET_NAMES = ("stdout.sock", "stderr.sock", "chan.sock")


@dataclass
class Connected:
    stdout: OutputStream
    stderr: OutputStream
    channel: FrameChannel
    transports: list[asyncio.BaseTransport]


class HostSockets:
    """A directory with three listening sockets; `accept` turns them into streams."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._listeners: list[socket.socket] = []

    @classmethod
    def create(cls, directory: Path) -> HostSockets:
        directory.mkdir(mode=0o755)
        # Search permission for the sandbox's uid; it can create nothing here.
        directory.chmod(0o755)
        sockets = cls(directory)
        try:
            for name in SOCKET_NAMES:
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sockets._listeners.append(listener)
                path = directory / name
                listener.bind(str(path))
                path.chmod(0o666)  # connect(2) needs write permission on the socket
                listener.listen(1)
                listener.setblocking(False)
        except BaseException:
            sockets.close()
            raise
        return sockets

    async def accept(self, timeout_s: float, name: str) -> Connected:
        loop = asyncio.get_running_loop()
        tasks = [asyncio.ensure_future(loop.sock_accept(ls)) for ls in self._listeners]
        try:
            done, _pending = await asyncio.wait(tasks, timeout=timeout_s)
            if len(done) < len(tasks):
                raise TimeoutError(f"the guest did not connect within {timeout_s} s")
        finally:
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            self._close_listeners()
        conns: list[socket.socket] = []
        for result in results:
            if isinstance(result, BaseException):
                for conn in conns:
                    conn.close()
                raise result
            conns.append(result[0])
        transports: list[asyncio.BaseTransport] = []
        try:
            out_t, out = await loop.create_unix_connection(OutputStream, sock=conns[0])
            transports.append(out_t)
            err_t, err = await loop.create_unix_connection(OutputStream, sock=conns[1])
            transports.append(err_t)
            channel = FrameChannel(conns[2], name)
        except BaseException:
            for conn in conns:
                conn.close()
            for transport in transports:
                transport.close()
            raise
        return Connected(out, err, channel, transports)

    def _close_listeners(self) -> None:
        for listener in self._listeners:
            listener.close()
        self._listeners.clear()

    def close(self) -> None:
        """Closes the listeners and removes the directory (the container keeps its mount)."""
        self._close_listeners()
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self.directory):
                with contextlib.suppress(FileNotFoundError):
                    (self.directory / name).unlink()
        shutil.rmtree(self.directory, ignore_errors=True)
