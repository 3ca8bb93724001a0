"""A process's exit status from its pidfd, for processes that are not our children.

A sandbox's pid 1 is the zygote's child (it is their subreaper), not ours. Since Linux 6.15 the
kernel keeps a reaped process's exit status for every holder of a pidfd to it
(`ioctl(PIDFD_GET_INFO)` with `PIDFD_INFO_EXIT`), so the host can learn how a sandbox ended
without a reaper process of its own beside every sandbox. The standard library has no wrapper;
the structure is fixed by the kernel's ABI (`include/uapi/linux/pidfd.h`, version 0, 64 bytes).
"""

from __future__ import annotations

import fcntl
import os
import struct

__all__ = ["exit_status", "exit_status_supported", "is_namespace_init"]

_PIDFD_INFO_SIZE = 64
# _IOWR(PIDFS_IOCTL_MAGIC 0xFF, 11, struct pidfd_info): read-write, 64 bytes, magic, number.
PIDFD_GET_INFO = (3 << 30) | (_PIDFD_INFO_SIZE << 16) | (0xFF << 8) | 11
PIDFD_INFO_EXIT = 1 << 3
_EXIT_CODE_OFFSET = 60  # mask u64, cgroupid u64, eleven u32 ids, then exit_code s32


def exit_status(pidfd: int) -> int | None:
    """The exit code as `os.waitstatus_to_exitcode` gives it (negative: killed by that
    signal), or None while the process has not been reaped yet."""
    info = bytearray(_PIDFD_INFO_SIZE)
    struct.pack_into("=Q", info, 0, PIDFD_INFO_EXIT)
    fcntl.ioctl(pidfd, PIDFD_GET_INFO, info)
    (mask,) = struct.unpack_from("=Q", info, 0)
    if not mask & PIDFD_INFO_EXIT:
        return None
    (status,) = struct.unpack_from("=i", info, _EXIT_CODE_OFFSET)
    return os.waitstatus_to_exitcode(status)


def exit_status_supported() -> bool:
    """Whether this kernel reports exit statuses through pidfds (a child that exits with 7;
    spawned, not forked: the caller may have threads)."""
    pid = os.posix_spawn("/bin/sh", ["sh", "-c", "exit 7"], {})
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        os.waitpid(pid, 0)
        return False
    try:
        os.waitpid(pid, 0)
        return exit_status(pidfd) == 7
    except OSError:
        return False
    finally:
        os.close(pidfd)


def is_namespace_init(pid: int) -> bool:
    """Whether ``pid`` is pid 1 of a pid namespace below ours: a sandbox's pid 1, not a
    process that took over the number of one that already exited."""
    # os.open/os.read, not a text file: once per sandbox start, on the host's path.
    try:
        fd = os.open(f"/proc/{pid}/status", os.O_RDONLY)
    except OSError:
        return False
    try:
        status = os.read(fd, 8192)
    except OSError:
        return False
    finally:
        os.close(fd)
    start = status.find(b"\nNSpid:")
    if start < 0:
        return False
    ids = status[start + 7 : status.find(b"\n", start + 1)].split()
    return len(ids) >= 2 and ids[-1] == b"1"
