"""A backend that runs nothing: scripted outcomes for tests of the service around the sandbox.

`FakeBackend` implements `Backend` and hands out `FakeSandbox` handles that speak the real
channel protocol (a socketpair served by the real `FrameChannel`) and the real output pipes, so
`run_single_use`, the broker, the engine, the server, tenants and the audit store all run exactly
as with a real sandbox. Only the guest is fake: a thread in this process that reads the job and
interprets its script as a tiny instruction language instead of running it. Nothing here
isolates anything: it is for tests (admission, queues, tenants, audit, conversions) and
benchmarks of the service's own overhead, never for untrusted code.

A fake script is valid Python (the engine compiles every script before a sandbox is taken),
one call per line with literal arguments:

==============================  ==============================================================
``print("text", ...)``          writes the texts, space-separated, and a newline to stdout
``stderr("text")``              writes the text and a newline to stderr
``call("tool", {"a": 1})``      one tool call through the broker; waits for the answer;
                                ``show=True`` prints the answer's value as JSON
``sleep(0.5)``                  waits (a kill ends it at once)
``wait("gate")``                waits until the test sets ``backend.gate("gate")``
``usage(cpu_time_s=.., ...)``   what `usage()` reports from then on (fields of ResourceUsage)
``exit(3)``                     ends with that exit code (the bootstrap's report says so)
``fail("Type", "message")``     ends like an uncaught exception on that line (exit code 1);
                                keywords add fields to the report (``errno="EAGAIN"``)
==============================  ==============================================================

Anything else ends the fake guest with a ``FakeScriptError`` naming the line. A script that
runs off its end exits 0. A kill (deadline, cancel) ends the guest at its next step with
exit code -9 and no report, as SIGKILL would.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import dataclasses
import json
import os
import socket
import struct
import threading
from typing import Any

from sandbox.backends.base import Capabilities, ResourceUsage
from sandbox.backends.channel import FrameChannel
from sandbox.capture import OutputStream
from sandbox.errors import InvalidArgument
from sandbox.limits import ResolvedLimits
from sandbox.protocol import encode_frame

__all__ = ["FakeBackend", "FakeSandbox"]

KILLED = -9
READY_TIMEOUT_S = 5.0
_HEADER = struct.Struct(">I")


class _Killed(Exception):
    pass


class _End(Exception):
    def __init__(self, exit_code: int, error: dict[str, Any] | None = None) -> None:
        self.exit_code = exit_code
        self.error = error


class FakeSandbox:
    """One single-use fake sandbox: the guest is a thread interpreting the job's script."""

    capabilities = Capabilities()  # no cgroup, no runtimes: every refusal is the guest's word

    def __init__(self, backend: FakeBackend, name: str) -> None:
        self._backend = backend
        self._loop = asyncio.get_running_loop()
        host, self._guest = socket.socketpair()
        self.channel = FrameChannel(host, name)
        self.isolation = ["fake"]
        self._killed = threading.Event()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        self._usage = ResourceUsage()
        self._pipes: list[int] = []
        self._transports: list[asyncio.BaseTransport] = []
        self.stdout: OutputStream
        self.stderr: OutputStream
        self._thread = threading.Thread(target=self._guest_main, name=f"fake-{name}", daemon=True)

    async def _start(self) -> None:
        streams = []
        for _ in range(2):
            read_fd, write_fd = os.pipe()
            self._pipes.append(write_fd)
            pipe = os.fdopen(read_fd, "rb", buffering=0)
            transport, stream = await self._loop.connect_read_pipe(OutputStream, pipe)
            self._transports.append(transport)
            streams.append(stream)
        self.stdout, self.stderr = streams
        self._thread.start()
        await self.channel.ready(READY_TIMEOUT_S)

    # -- SandboxHandle -------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return not self._exited.done()

    async def apply_limits(self, limits: ResolvedLimits) -> None:
        return None

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def exit_future(self) -> asyncio.Future[int]:
        return self._exited

    async def kill(self) -> None:
        self._killed.set()
        with contextlib.suppress(OSError):
            self._guest.shutdown(socket.SHUT_RDWR)  # ends a wait for a tool's answer
        await self.wait()

    def usage(self) -> ResourceUsage:
        return self._usage

    async def dispose(self) -> None:
        if not self._exited.done():
            await self.kill()
        await self.channel.close()
        for transport in self._transports:
            transport.close()
        self._backend._release(self)

    # -- the fake guest, on its own thread -----------------------------------------------------
    def _guest_main(self) -> None:
        exit_code = KILLED
        try:
            self._send({"t": "ready", "pid": 1})
            job = self._recv()
            exit_code, error = self._interpret(str(job.get("script", "")))
            status = "ok" if exit_code == 0 else "error"
            self._send({"t": "end", "status": status, "exit_code": exit_code, "error": error})
        except (_Killed, OSError, ValueError):
            exit_code = KILLED
        finally:
            if self._killed.is_set():
                exit_code = KILLED
            for fd in self._pipes:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._guest.close()
            self._loop.call_soon_threadsafe(_resolve, self._exited, exit_code)

    def _interpret(self, script: str) -> tuple[int, dict[str, Any] | None]:
        next_id = 1
        for statement in ast.parse(script).body:
            if self._killed.is_set():
                raise _Killed
            line = statement.lineno
            try:
                name, args, kwargs = _instruction(statement)
            except ValueError as exc:
                return 1, {"type": "FakeScriptError", "message": str(exc), "line": line}
            try:
                if name == "call":
                    self._call(next_id, *args, **kwargs)
                    next_id += 1
                else:
                    self._step(name, args, kwargs)
            except _End as end:
                if end.error is not None:
                    end.error["line"] = line
                return end.exit_code, end.error
            except TypeError as exc:
                return 1, {"type": "FakeScriptError", "message": str(exc), "line": line}
        return 0, None

    def _step(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> None:
        if name == "print":
            os.write(self._pipes[0], (" ".join(map(str, args)) + "\n").encode())
        elif name == "stderr":
            os.write(self._pipes[1], (" ".join(map(str, args)) + "\n").encode())
        elif name == "sleep":
            if self._killed.wait(float(args[0])):
                raise _Killed
        elif name == "wait":
            gate = self._backend.gate(str(args[0]))
            while not gate.wait(0.01):
                if self._killed.is_set():
                    raise _Killed
        elif name == "usage":
            self._usage = dataclasses.replace(self._usage, accounted=True, **kwargs)
        elif name == "exit":
            raise _End(int(args[0]) if args else 0)
        elif name == "fail":
            # Further fields of the report (errno, refused_by) as keyword arguments.
            report = {"type": str(args[0]), "message": str(args[1]) if len(args) > 1 else ""}
            raise _End(1, {**kwargs, **report})
        else:
            raise TypeError(f"unknown fake instruction {name!r}")

    def _call(self, call_id: int, tool: str, arguments: Any = None, show: bool = False) -> None:
        self._send({"t": "call", "id": call_id, "tool": tool, "args": arguments or {}})
        reply = self._recv()
        if show:
            shown = reply.get("value") if reply.get("ok") else {"error": reply.get("message")}
            os.write(self._pipes[0], (json.dumps(shown) + "\n").encode())

    def _send(self, message: dict[str, Any]) -> None:
        self._guest.sendall(encode_frame(message))

    def _recv(self) -> dict[str, Any]:
        header = self._recv_exactly(_HEADER.size)
        body = self._recv_exactly(_HEADER.unpack(header)[0])
        value: dict[str, Any] = json.loads(body)
        return value

    def _recv_exactly(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = self._guest.recv(size - len(data))
            if not chunk:
                raise _Killed
            data += chunk
        return bytes(data)


class FakeBackend:
    """A `Backend` whose sandboxes run nothing (see the module docstring).

    ``name`` is what the engine and tenants know it as ("process" stands in for the default
    backend). ``started`` counts sandboxes handed out, ``running`` those not yet disposed of,
    ``peak_running`` the most at once: what admission tests assert on.
    """

    def __init__(self, name: str = "process") -> None:
        self.name = name
        self.started = 0
        self.running = 0
        self.peak_running = 0
        self._gates: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._open: set[FakeSandbox] = set()

    def gate(self, name: str) -> threading.Event:
        """The gate a ``wait("name")`` instruction waits on: ``.set()`` it to let them go."""
        with self._lock:
            return self._gates.setdefault(name, threading.Event())

    @property
    def capabilities(self) -> Capabilities:
        return FakeSandbox.capabilities

    @property
    def pool(self) -> None:
        return None  # every sandbox is started on demand

    @property
    def capacity(self) -> None:
        return None  # no max_sandboxes: each acquire starts one

    async def start(self) -> None:
        return None

    def check_runtime(self, name: str) -> None:
        raise InvalidArgument(f"runtime: the {self.name} backend does not support runtimes")

    async def acquire(self, limits: ResolvedLimits, runtime: str | None = None) -> FakeSandbox:
        if runtime is not None:
            self.check_runtime(runtime)
        self.started += 1
        sandbox = FakeSandbox(self, f"{self.name}-{self.started}")
        self._open.add(sandbox)
        self.running += 1
        self.peak_running = max(self.peak_running, self.running)
        try:
            await sandbox._start()
        except BaseException:
            await sandbox.dispose()
            raise
        return sandbox

    def _release(self, sandbox: FakeSandbox) -> None:
        if sandbox in self._open:
            self._open.discard(sandbox)
            self.running -= 1

    def isolation(self) -> list[str]:
        return ["fake"]

    async def close(self) -> None:
        for sandbox in list(self._open):
            await sandbox.dispose()


def _instruction(statement: ast.stmt) -> tuple[str, list[Any], dict[str, Any]]:
    """``name(literal, ..., key=literal)`` as its parts; ValueError for anything else."""
    if not (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Call)
        and isinstance(statement.value.func, ast.Name)
    ):
        raise ValueError("a fake script is one instruction call per line")
    call = statement.value
    name = statement.value.func.id
    try:
        args = [ast.literal_eval(arg) for arg in call.args]
        kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg}
    except ValueError:
        raise ValueError(f"{name}: arguments must be literals") from None
    return name, args, kwargs


def _resolve(future: asyncio.Future[int], value: int) -> None:
    if not future.done():
        future.set_result(value)
