"""One epoll for every sandbox descriptor the host reads, watched by the event loop as one reader.

A process sandbox has five descriptors the host reads on the event loop (its tool channel,
stdout, stderr, the pidfd of its pid 1, and the fork server's reply while it starts), each
watched from its start to its end. Through asyncio's own `add_reader` every one of them costs a
selector key, a handle, and a callback scheduled per readiness: on asyncio's pure-Python loop
an `add_reader`/`remove_reader` pair took about 20-30 us of host CPU against 3 us for the same
two `epoll_ctl` calls made directly, and the selector's bookkeeping was a tenth of the host's
calls per ``print(1)`` (`bench.host_profile`). Here the loop watches one epoll descriptor, and
the descriptors go into that epoll straight: registering one is one system call, and one loop
callback runs the callbacks of every descriptor that turned readable at once.

The semantics are asyncio's `add_reader`: level-triggered, the callback runs on the loop's
thread, with no argument, until `unwatch`. Two rules keep a reused descriptor number safe, as
they do for asyncio: `unwatch` before closing; and a descriptor unwatched while a batch of
events is being dispatched gets none of that batch's events, even when its number is watched
again by then (its event was the closed descriptor's).

There is one per event loop (`for_loop`); its epoll descriptor exists while something is watched
(made at the first `watch`, closed with the last `unwatch`), so nothing outlives the sandboxes.
A library does not do this: uvloop and asyncio register each descriptor as its own reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import weakref
from collections.abc import Callable

__all__ = ["EpollReaders", "for_loop"]

MAX_EVENTS = 256  # per dispatch; more stay ready and come in the next one
_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, EpollReaders] = (
    weakref.WeakKeyDictionary()
)


def for_loop(loop: asyncio.AbstractEventLoop | None = None) -> EpollReaders:
    """The readers of ``loop`` (the running loop by default), made on first use."""
    loop = loop or asyncio.get_running_loop()
    readers = _BY_LOOP.get(loop)
    if readers is None:
        readers = _BY_LOOP[loop] = EpollReaders(loop)
    return readers


class EpollReaders:
    """Descriptors watched for reading through one epoll, dispatched by one loop reader."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._epoll: select.epoll | None = None
        self._callbacks: dict[int, Callable[[], object]] = {}
        self._dispatching = False
        self._dropped: set[int] = set()  # unwatched during the current dispatch

    def watch(self, fd: int, callback: Callable[[], object]) -> None:
        """Calls ``callback`` on the loop whenever ``fd`` is readable (or at its end)."""
        if fd in self._callbacks:
            raise ValueError(f"descriptor {fd} is already watched")
        if self._epoll is None:
            self._epoll = select.epoll()
            self._loop.add_reader(self._epoll.fileno(), self._dispatch)
        self._epoll.register(fd, select.EPOLLIN)
        self._callbacks[fd] = callback

    def unwatch(self, fd: int) -> None:
        """Stops watching ``fd`` (before it is closed); a no-op for one not watched."""
        if self._callbacks.pop(fd, None) is None:
            return
        if self._dispatching:
            self._dropped.add(fd)
        assert self._epoll is not None
        with contextlib.suppress(OSError):  # closed already: the kernel dropped it itself
            self._epoll.unregister(fd)
        if not self._callbacks and not self._dispatching:
            self._close()

    def _dispatch(self) -> None:
        epoll = self._epoll
        if epoll is None:
            return
        self._dispatching = True
        try:
            for fd, _events in epoll.poll(0, MAX_EVENTS):
                if fd in self._dropped:
                    continue
                callback = self._callbacks.get(fd)
                if callback is None:
                    continue
                try:
                    callback()
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:  # as asyncio reports a failing callback
                    self._loop.call_exception_handler(
                        {
                            "message": f"exception in the reader of descriptor {fd}",
                            "exception": exc,
                        }
                    )
        finally:
            self._dispatching = False
            self._dropped.clear()
            if not self._callbacks:
                self._close()

    def _close(self) -> None:
        epoll, self._epoll = self._epoll, None
        if epoll is None:
            return
        if not self._loop.is_closed():
            self._loop.remove_reader(epoll.fileno())
        epoll.close()
