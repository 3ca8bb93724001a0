"""Room for threads under an address-space limit (standard library only; runs in the sandbox).

Where the memory limit is RLIMIT_AS (no memory cgroup: the degraded process backend), the kernel
counts address space *reserved*, not memory used, and glibc reserves a lot per thread: a stack
of RLIMIT_STACK (8 MiB) and, on the thread's first allocation, a malloc arena of 64 MiB
(HEAP_MAX_SIZE on 64-bit). Measured in a guest under a 1 GiB RLIMIT_AS (tests/sandbox/
test_thread_room.py): 27 MiB before any thread, then 72 MiB more per thread, so a 256 MiB limit
refused the fourth thread while the script used a few MiB. The bootstrap calls `make_room` before
it lowers its rlimits and before any untrusted byte, so that a thread costs what it uses:

- one malloc arena for the whole process (``mallopt(M_ARENA_MAX, 1)``, and ``MALLOC_ARENA_MAX=1``
  in the environment for the programs the script starts): threads share the main arena, whose
  heap grows with ``brk`` as it is used. Python's own small-object allocator is unaffected, and
  the GIL already serialises most allocations, so the shared arena's lock costs little;
- a default thread stack of `stack_bytes` (``pthread_setattr_default_np``, which every thread
  the process starts without a size of its own gets, Python's and a C extension's alike):
  the limit's share per allowed process, between 256 KiB and 8 MiB (1 MiB for 256 MiB and 64
  processes), so the `processes` limit's worth of threads reserves at most a quarter of it.

Programs the script executes read RLIMIT_STACK afresh for their own threads' stacks; it is left
at its default, because it also bounds the main thread's stack of the script itself.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any

__all__ = [
    "STACK_MAX_BYTES",
    "STACK_MIN_BYTES",
    "address_space_full",
    "make_room",
    "refused_by",
    "stack_bytes",
    "watch_thread_starts",
]

M_ARENA_MAX = -8  # glibc's mallopt parameter
STACK_MIN_BYTES = 256 * 1024
STACK_MAX_BYTES = 8 * 1024 * 1024
_ATTR_BYTES = 128  # at least sizeof(pthread_attr_t) on every glibc ABI (56 or 64 today)
_STACK_SIZE = {"bytes": 0}


def stack_bytes(as_bytes: int, processes: int) -> int:
    """The default stack of a thread under an RLIMIT_AS of ``as_bytes`` and ``processes``
    allowed tasks: a quarter of the limit shared among them, within 256 KiB..8 MiB, whole
    64 KiB (a multiple of every page size)."""
    share = as_bytes // (4 * max(processes, 1))
    share -= share % (64 * 1024)
    return max(STACK_MIN_BYTES, min(STACK_MAX_BYTES, share))


def make_room(as_bytes: int, processes: int) -> None:
    """One malloc arena and smaller default thread stacks, for this process and (the arena)
    what it executes. Where the C library is not glibc (no ``mallopt`` or
    ``pthread_setattr_default_np``), Python's own threads still get the smaller stack."""
    size = stack_bytes(as_bytes, processes)
    _STACK_SIZE["bytes"] = size
    os.environ["MALLOC_ARENA_MAX"] = "1"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mallopt(M_ARENA_MAX, 1)
        attr = ctypes.create_string_buffer(_ATTR_BYTES)
        if libc.pthread_attr_init(attr) == 0:
            try:
                if (
                    libc.pthread_attr_setstacksize(attr, ctypes.c_size_t(size)) == 0
                    and libc.pthread_setattr_default_np(attr) == 0
                ):
                    return
            finally:
                libc.pthread_attr_destroy(attr)
    except (AttributeError, OSError):
        pass
    import threading

    threading.stack_size(size)


_REFUSALS: dict[str, str] = {}


def watch_thread_starts(nproc_set: bool) -> None:
    """Notes, at the moment a thread start fails, which rlimit refused it (`refused_by`): the
    address space is probed right then, before the script's other threads can exit and free
    theirs. Python raises no audit event for a thread start, so the two functions that start
    one (`_thread.start_new_thread` and threading's copy of it) are wrapped; a script that
    unwraps them only loses the distinction, which is the guest's word either way."""
    import _thread
    import threading

    start: Any = _thread.start_new_thread

    def start_new_thread(function: Any, args: Any, kwargs: Any = None) -> int:
        try:
            if kwargs is None:
                return int(start(function, args))
            return int(start(function, args, kwargs))
        except RuntimeError:
            _REFUSALS["by"] = (
                "RLIMIT_AS" if address_space_full() else "RLIMIT_NPROC" if nproc_set else ""
            )
            raise

    _thread.start_new_thread = start_new_thread
    threading._start_new_thread = start_new_thread  # type: ignore[attr-defined]


def refused_by() -> str:
    """The rlimit that refused the latest failed thread start ("" when none did)."""
    return _REFUSALS.get("by", "")


def address_space_full() -> bool:
    """Whether one more thread's stack (and its guard page) no longer fits under RLIMIT_AS:
    the kernel refuses the reservation itself. Asked after a refused thread start, to tell
    a start the address-space limit refused from one RLIMIT_NPROC refused (both are EAGAIN
    from pthread_create, "can't start new thread" in Python)."""
    size = (_STACK_SIZE["bytes"] or STACK_MAX_BYTES) + mmap.PAGESIZE
    try:
        probe = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _NORESERVE)
    except OSError:
        return True
    probe.close()
    return False


_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
