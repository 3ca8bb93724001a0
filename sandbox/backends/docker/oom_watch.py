"""The kernel's notice that a container's memory cgroup ran out of memory, acted on at once.

An out-of-memory container is gone within milliseconds: the OOM killer kills its pid 1 and the
engine removes its cgroup as soon as it sees the exit (containerd, then `runc delete`). Under load
that removal came before the host's own look at the exit (the pidfd's callback on the event loop),
so the counters at the kill were lost, and the memory violation's ``observed`` was whatever the
last `CPU_POLL_S` sample had seen on the way up (117 MiB of a 128 MiB limit), in about one run in
ten on a loaded machine.

The kernel tells of the out-of-memory state before it picks a victim: on cgroup v1 through an
eventfd registered on ``memory.oom_control`` (`ContainerCgroup.oom_notifier`), on v2 as a change
of ``memory.events``. One daemon thread waits on every watched container's notifier with epoll
and calls its handler there, off the event loop, while the victim is still being killed and its
cgroup is still there to read. That thread can still be late on a loaded host (2 runs in 200 of
a stress loop). The kill is not held for it: with ``oom_kill_disable`` set (cgroup v1) the kernel
lets only a page fault wait at the limit, and fails every other charge with ENOMEM (a pipe's or a
file's page, gVisor's own memory file), so a sandbox would see errors it never sees without the
hold; under gVisor a recursion bomb then ended as a script error instead of a memory kill.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["OomNotifier", "OomWatch", "oom_watch"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OomNotifier:
    """A descriptor that reports the cgroup's out-of-memory events: an eventfd (cgroup v1,
    readable once signalled; also signalled when the cgroup is removed) or the open
    ``memory.events`` file (cgroup v2: EPOLLPRI once it changed, until it is read again)."""

    fd: int
    eventfd: bool

    def rearm(self) -> bool:
        """Consumes the notice so that only the next one wakes the watcher; False once the
        cgroup is gone (v2: its file no longer reads), when there is nothing more to watch."""
        try:
            if self.eventfd:
                os.eventfd_read(self.fd)
            else:
                os.pread(self.fd, 4096, 0)
        except BlockingIOError:
            return True  # an eventfd read by an earlier wake-up already
        except OSError:
            return False
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


class OomWatch:
    """Calls each watched notifier's handler on its thread as soon as the kernel signals it.

    Handlers run with the watch's lock held, and `unwatch` takes it: once `unwatch` returns, the
    handler of that notifier is not running and never runs again, and its descriptor is closed
    (by the watch, so that a reused descriptor number never reaches an old handler)."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[OomNotifier, Callable[[], None]]] = {}
        self._thread = threading.Thread(target=self._run, name="ptc-docker-oom", daemon=True)
        self._thread.start()

    def watch(self, notifier: OomNotifier, handler: Callable[[], None]) -> None:
        events = select.EPOLLIN if notifier.eventfd else select.EPOLLPRI
        with self._lock:
            self._watched[notifier.fd] = (notifier, handler)
            self._epoll.register(notifier.fd, events)

    def unwatch(self, notifier: OomNotifier) -> None:
        with self._lock:
            self._drop(notifier)

    def _drop(self, notifier: OomNotifier) -> None:
        if self._watched.pop(notifier.fd, None) is None:
            return
        with contextlib.suppress(OSError):
            self._epoll.unregister(notifier.fd)
        notifier.close()

    def _run(self) -> None:
        while True:
            try:
                ready = self._epoll.poll()
            except InterruptedError:
                continue
            with self._lock:
                for fd, _events in ready:
                    entry = self._watched.get(fd)
                    if entry is None:
                        continue  # unwatched since the poll returned
                    notifier, handler = entry
                    # Consumed first: a notice that comes while the handler reads is the next.
                    alive = notifier.rearm()
                    try:
                        handler()
                    except Exception:  # a bug in one handler must not end every watch
                        log.exception("the OOM notice handler of descriptor %d failed", fd)
                    if not alive:
                        self._drop(notifier)


_WATCH: list[OomWatch] = []  # the process's one watch, once started
_WATCH_LOCK = threading.Lock()


def oom_watch() -> OomWatch:
    """The process's one watch, started on first use (not at import: importing the backend
    starts no thread)."""
    with _WATCH_LOCK:
        if not _WATCH:
            _WATCH.append(OomWatch())
        return _WATCH[0]
