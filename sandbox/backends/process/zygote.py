"""The host's side of the fork server: starting, supervising and replacing the zygote.

One zygote per process backend (`sandbox.guest.zygote` runs inside it) forks every sandbox.
Requests are serialized on one SOCK_SEQPACKET socket under a lock: `fork_async` sends its request
and awaits the reply on the event loop (no worker thread per sandbox); starting or replacing a
zygote, which blocks for a while, happens in a worker thread (`fork`). The
supervisor replaces the zygote when it has died (and logs it: sandboxes it already forked are
not its children in any way that matters and run on), and retires it after `max_forks` forks or
`max_age_s` seconds, because every child shares the zygote's address-space layout and hash
seed: a bounded generation bounds what one sandbox can learn about the next. A retired zygote
forks no more but lives until its last sandbox has exited (it reaps them, which is what makes
their exit statuses known), and kills them should the host go away first. A zygote that cannot
start is an `Unavailable` error naming bwrap's own message.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sandbox import epoll_readers
from sandbox.backends.process.bwrap import ZygoteOptions, as_user_prefix, zygote_argv
from sandbox.backends.process.seccomp import program_fd
from sandbox.backends.process.uid_range import UidRange, UsernsGate
from sandbox.errors import Unavailable

__all__ = ["Forked", "ZygoteSettings", "ZygoteSupervisor"]

log = logging.getLogger(__name__)

BWRAP_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
READY_TIMEOUT_S = 20.0
REPLY_TIMEOUT_S = 10.0
MAX_REPLY_BYTES = 4096
NOTE_PREFIX = "ptc-zygote: note: "  # `sandbox.guest.zygote`'s lines that report no failure
RETIRED_EXIT_TIMEOUT_S = 10.0  # at close: how long a retired zygote's sandboxes may take to go


@dataclass(frozen=True)
class ZygoteSettings:
    python: str
    runtime_dir: Path
    uid: int
    gid: int
    seccomp: bool
    max_forks: int  # forks before the zygote is replaced (layout and hash seed rotate)
    max_age_s: float  # seconds before the zygote is replaced
    # How the host learns a sandbox's exit status: a pidfd to its pid 1 (Linux 6.15+), or a
    # reaper process beside each sandbox.
    exit_status: Literal["pidfd", "reaper"]
    runtime_tree: Path | None = None  # a runtime's tree to bind read-only (`sandbox.runtimes`)
    preload: tuple[str, ...] = ()  # modules the zygote imports once, before forking
    # The uids mapped in the zygote's user namespace for its sandboxes, one each (`uid_range`);
    # None: every sandbox runs as ``uid``.
    sandbox_uids: UidRange | None = None


@dataclass(frozen=True)
class Forked:
    pid: int  # a host pid: the sandbox's pid 1 when `init`, else its first child's
    init: bool  # born in its own pid namespace (one fork); else its first child reports pid 1


class _Zygote:
    """One running zygote."""

    def __init__(self, proc: subprocess.Popen[bytes], control: socket.socket) -> None:
        self.proc = proc
        self.pid: int | None = None  # the zygote's own host pid (bwrap's is proc.pid)
        self.reaper: threading.Thread | None = None
        self.control = control
        self.started_at = time.monotonic()
        self.forks = 0

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def request(self, message: bytes, fds: list[int]) -> list[bytes]:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        self.control.sendmsg([message], rights)
        return self.read_reply()

    async def request_async(self, message: bytes, fds: list[int]) -> list[bytes]:
        """`request` on the event loop: the reply is awaited through the loop's selector."""
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        # A SOCK_SEQPACKET send of one small message: the socket has room, it does not block.
        self.control.sendmsg([message], rights)
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()
        fd = self.control.fileno()
        readers = epoll_readers.for_loop(loop)
        readers.watch(fd, lambda: _resolve_once(readable))
        timer = loop.call_later(REPLY_TIMEOUT_S, _expire, readable)  # not asyncio.timeout: cheaper
        try:
            await readable
        finally:
            timer.cancel()
            readers.unwatch(fd)
        return self.read_reply()

    def read_reply(self) -> list[bytes]:
        """One message of the zygote's, as its words (`sandbox.guest.zygote` has the format):
        ``ready PID``, ``forked PID 1|0`` or ``error MESSAGE``."""
        data = self.control.recv(MAX_REPLY_BYTES)
        if not data:
            raise ConnectionError("the fork server closed its control socket")
        words = data.split(b" ")
        if words[0] not in (b"ready", b"forked", b"error"):
            raise ValueError(f"the fork server sent {data[:200]!r}")
        return words

    def retire(self, wait: bool = False) -> None:
        """Asks the zygote to fork no more and to exit once its last sandbox has; the control
        socket stays open meanwhile (its end is the zygote's sign that the host is gone).
        Reaped in the background, or here when ``wait``."""
        with contextlib.suppress(OSError):
            self.control.send(b"retire")
        if wait:
            self._reap(RETIRED_EXIT_TIMEOUT_S)
        else:
            self.reaper = threading.Thread(
                target=self._reap, args=(None,), name="ptc-zygote-reap", daemon=True
            )
            self.reaper.start()

    def _reap(self, timeout_s: float | None) -> None:
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # Closing the control socket tells the zygote to kill what it still has.
            with contextlib.suppress(OSError):
                self.control.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        finally:
            with contextlib.suppress(OSError):
                self.control.close()
            if self.proc.stderr is not None:
                with contextlib.suppress(OSError):
                    self.proc.stderr.close()


def _start(settings: ZygoteSettings) -> _Zygote:
    host, guest = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    program = program_fd() if settings.seccomp else os.memfd_create("ptc-no-seccomp")
    proc: subprocess.Popen[bytes] | None = None
    gate = UsernsGate(settings.sandbox_uids)
    try:
        argv = _argv(settings, guest.fileno(), program, gate)
        # No user=/group= here: they make `subprocess` fork(2) instead of vfork(2) and so run
        # the host's fork handlers in the child (`as_user_prefix` says why that kills it).
        proc = subprocess.Popen(
            [*as_user_prefix(settings.uid, settings.gid), *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=(guest.fileno(), program, *gate.bwrap_fds()),
            start_new_session=True,
            # The zygote's environment is what every sandbox inherits: never the server's.
            env=BWRAP_ENV,
        )
        assert proc is not None
        guest.close()
        zygote = _Zygote(proc, host)
        _await_ready(zygote, settings, gate, argv)
        # The zygote's stderr carries only its own failures; read it so it can never block.
        threading.Thread(
            target=_log_stderr, args=(proc,), name="ptc-zygote-log", daemon=True
        ).start()
        return zygote
    except BaseException:
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
        host.close()
        raise
    finally:
        guest.close()
        os.close(program)
        gate.close()


def _argv(settings: ZygoteSettings, control_fd: int, program: int, gate: UsernsGate) -> list[str]:
    """The zygote's command line (`zygote_argv`), naming the descriptors it is passed."""
    return zygote_argv(
        ZygoteOptions(
            python=settings.python,
            runtime_dir=settings.runtime_dir,
            uid=settings.uid,
            gid=settings.gid,
            control_fd=control_fd,
            program_fd=program,
            runtime_tree=settings.runtime_tree,
            preload=settings.preload,
            userns_block_fd=gate.block_r,
            info_fd=gate.info_w,
        )
    )


def _await_ready(
    zygote: _Zygote, settings: ZygoteSettings, gate: UsernsGate, argv: list[str]
) -> None:
    """Opens the user namespace gate and waits for the zygote's ``ready`` and its host pid;
    a zygote that does not say it in time is killed (`_did_not_start`)."""
    zygote.control.settimeout(READY_TIMEOUT_S)
    try:
        gate.open(settings.uid, settings.gid, settings.python, READY_TIMEOUT_S)
        ready = zygote.read_reply()
    except (OSError, ValueError) as exc:
        raise _did_not_start(zygote.proc, argv, exc) from exc
    if len(ready) != 2 or ready[0] != b"ready" or not ready[1].isdigit():
        raise Unavailable(f"the fork server did not say ready: {b' '.join(ready)!r}")
    zygote.pid = int(ready[1])
    zygote.control.settimeout(REPLY_TIMEOUT_S)


def _did_not_start(proc: subprocess.Popen[bytes], argv: list[str], exc: Exception) -> Unavailable:
    """Kills a zygote that did not start, with its whole process group (a bwrap child still
    blocked before its user namespace was mapped holds the stderr pipe open and would hold the
    read here forever), and says why with bwrap's own message."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.kill()
    proc.wait()
    err = proc.stderr.read(4000).decode(errors="replace").strip() if proc.stderr else ""
    return Unavailable(
        f"the fork server did not start: {err or exc!r} (command: {' '.join(argv[:3])} ...)"
    )


def _resolve_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _expire(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_exception(TimeoutError(f"the fork server did not reply in {REPLY_TIMEOUT_S} s"))


def _has_children(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listing:
            return bool(listing.read().split())
    except OSError:
        return False


def _log_stderr(proc: subprocess.Popen[bytes]) -> None:
    stream = proc.stderr
    if stream is None:
        return
    with contextlib.suppress(ValueError, OSError):
        for line in stream:
            text = line.decode(errors="replace").rstrip()
            # Its notes (how it forks) are information; anything else is one of its failures.
            level = logging.INFO if text.startswith(NOTE_PREFIX) else logging.WARNING
            log.log(level, "fork server %d: %s", proc.pid, text)


class ZygoteSupervisor:
    """Hands out forks; replaces a dead, old or worn zygote on the next request."""

    def __init__(self, settings: ZygoteSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._async_lock = asyncio.Lock()  # `fork_async` callers queue here, not on `_lock`
        self._zygote: _Zygote | None = None
        self._closed = False
        self.generations = 0  # zygotes started so far
        self.deaths = 0  # zygotes found dead (not retired by us)
        self._retiring: list[_Zygote] = []

    def start(self) -> None:
        """Starts the first zygote; raises `Unavailable` when it cannot start."""
        with self._lock:
            self._current()

    def pids(self) -> list[int]:
        """bwrap's and the zygote's host pids (none while no zygote runs)."""
        zygote = self._zygote
        if zygote is None:
            return []
        return [zygote.proc.pid, *([zygote.pid] if zygote.pid is not None else [])]

    def _worn(self, zygote: _Zygote) -> bool:
        age = time.monotonic() - zygote.started_at
        return zygote.forks >= self.settings.max_forks or age >= self.settings.max_age_s

    def _current(self) -> _Zygote:
        if self._closed:
            raise Unavailable("the process backend is closed")
        zygote = self._zygote
        if zygote is not None and not zygote.alive:
            self.deaths += 1
            log.warning(
                "the fork server (pid %d) exited with status %s; starting a new one",
                zygote.proc.pid,
                zygote.proc.returncode,
            )
            self._retire(zygote)
            zygote = self._zygote = None
        if zygote is not None and self._worn(zygote):
            self._retire(zygote)
            zygote = self._zygote = None
        if zygote is None:
            zygote = self._zygote = _start(self.settings)
            self.generations += 1
        return zygote

    def fork(self, tmp_bytes: int, fds: list[int], attempts: int = 2) -> Forked:
        """Forks one sandbox with these four descriptors (channel, stdout, stderr, status).
        Blocking: call from a worker thread."""
        with self._lock:
            for attempt in range(1, attempts + 1):
                zygote = self._current()
                try:
                    reply = zygote.request(self._request(tmp_bytes), fds)
                except (OSError, ValueError) as exc:
                    # Died under us: one retry with a fresh zygote, then give up.
                    self._failed(zygote, exc)
                    if attempt == attempts:
                        raise Unavailable(f"the fork server failed: {exc!r}") from exc
                    continue
                return self._forked(zygote, reply)
        raise AssertionError("unreachable")

    async def fork_async(self, tmp_bytes: int, fds: list[int]) -> Forked:
        """`fork` from the event loop: the request goes out and its reply comes back through
        the loop, with no worker thread. When the zygote must be started or replaced first
        (dead, worn, or failing this very request) that part runs in a worker thread."""
        async with self._async_lock:
            zygote = self._zygote
            usable = zygote is not None and zygote.alive and not self._worn(zygote)
            if zygote is None or not usable or self._closed or not self._lock.acquire(False):
                return await asyncio.to_thread(self.fork, tmp_bytes, fds)
            try:
                reply = await zygote.request_async(self._request(tmp_bytes), fds)
            except (OSError, ValueError) as exc:  # TimeoutError is an OSError
                self._failed(zygote, exc)
            else:
                return self._forked(zygote, reply)
            finally:
                self._lock.release()
            # Its one retry, with a fresh zygote (started in a worker thread).
            return await asyncio.to_thread(self.fork, tmp_bytes, fds, 1)

    def _request(self, tmp_bytes: int) -> bytes:
        return b"fork %d %s" % (tmp_bytes, self.settings.exit_status.encode())

    def _failed(self, zygote: _Zygote, exc: BaseException) -> None:
        log.warning(
            "the fork server (pid %d) failed a request (%r); starting a new one",
            zygote.proc.pid,
            exc,
        )
        self._retire(zygote)
        if self._zygote is zygote:
            self._zygote = None
        self.deaths += 1

    def _forked(self, zygote: _Zygote, reply: list[bytes]) -> Forked:
        if (
            len(reply) != 3
            or reply[0] != b"forked"
            or not reply[1].isdigit()
            or reply[2] not in (b"0", b"1")
        ):
            said = b" ".join(reply[1:] if reply[0] == b"error" else reply)
            raise Unavailable(f"the fork server refused a fork: {said.decode(errors='replace')}")
        zygote.forks += 1
        # 1: the pid is the sandbox's pid 1; 0: its first child's, which reports pid 1.
        return Forked(int(reply[1]), reply[2] == b"1")

    def _retire(self, zygote: _Zygote) -> None:
        zygote.retire()
        self._retiring = [z for z in self._retiring if z.proc.poll() is None] + [zygote]

    def wait_retired(self, timeout_s: float = 10.0) -> None:
        """Waits until every retired zygote has exited or still has sandboxes to wait for
        (tests check for leftovers)."""
        deadline = time.monotonic() + timeout_s
        for zygote in list(self._retiring):
            while zygote.alive and not _has_children(zygote.pid):
                if time.monotonic() > deadline:
                    return
                time.sleep(0.01)
            if not zygote.alive and zygote.reaper is not None:
                zygote.reaper.join(max(0.0, deadline - time.monotonic()))

    def retired_pids(self) -> list[int]:
        """bwrap's and the zygote's host pids of retired zygotes still running: each lives
        until its last sandbox has exited."""
        return [
            pid
            for zygote in list(self._retiring)
            if zygote.alive
            for pid in (zygote.proc.pid, zygote.pid)
            if pid is not None
        ]

    def replace(self) -> None:
        """Starts a new zygote now and retires the old one (blocking; for operators and the
        benchmark that measures what a rotation costs)."""
        with self._lock:
            if self._zygote is not None:
                self._retire(self._zygote)
                self._zygote = None
            self._current()

    def close(self) -> None:
        """Stops the zygote and waits for it (blocking)."""
        with self._lock:
            self._closed = True
            if self._zygote is not None:
                self._zygote.retire(wait=True)
                self._zygote = None
        self.wait_retired(RETIRED_EXIT_TIMEOUT_S)
        for zygote in self._retiring:  # sandboxes outlived the wait: the zygote kills them
            if zygote.alive:
                zygote._reap(0)
