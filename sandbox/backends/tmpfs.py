"""The host's measurement of a sandbox's private tmpfs mounts (its /tmp and /dev/shm).

A write the file size limit refused (ENOSPC on a full tmpfs, EFBIG at RLIMIT_FSIZE, which is the
same size) is seen only by the guest; what the host can see is the mount it filled. The host
(root) opens a directory fd on each mount through ``/proc/<pid>/root`` of a process inside the
sandbox while the sandbox is ready and no script has run yet, and measures it with ``fstatvfs``
at the end. The fd keeps the mount's superblock alive after every process of the sandbox has
gone, so the measurement needs no race with the guest's exit; closing the probe releases the
mount (and the memory its files hold).

Opened before the job is sent, the paths are the ones the backend mounted: the script cannot
have replaced them yet, and ``O_NOFOLLOW`` refuses a symlink anyway.
"""

from __future__ import annotations

import contextlib
import os

from sandbox.backends.base import TmpfsUsage

__all__ = ["SANDBOX_TMPFS", "TmpfsProbe"]

SANDBOX_TMPFS = ("/tmp", "/dev/shm")


class TmpfsProbe:
    """Directory fds on a live sandbox's tmpfs mounts; `sample` measures them, `close` lets go."""

    def __init__(self, fds: dict[str, int]) -> None:
        self._fds = fds

    @classmethod
    def open(cls, pid: int, mounts: tuple[str, ...] = SANDBOX_TMPFS) -> TmpfsProbe:
        """Opens each mount of the sandbox that ``pid`` (a host pid inside it) sees; a mount
        the host cannot open (no such path, no permission, the process gone) is left out."""
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        fds: dict[str, int] = {}
        for mount in mounts:
            with contextlib.suppress(OSError):
                fds[mount] = os.open(f"/proc/{pid}/root{mount}", flags)
        return cls(fds)

    def sample(self) -> tuple[TmpfsUsage, ...]:
        out = []
        for mount, fd in self._fds.items():
            try:
                st = os.fstatvfs(fd)
            except OSError:
                continue
            block = st.f_frsize or st.f_bsize
            out.append(
                TmpfsUsage(
                    mount,
                    used_bytes=(st.f_blocks - st.f_bfree) * block,
                    size_bytes=st.f_blocks * block,
                    available_bytes=st.f_bavail * block,
                )
            )
        return tuple(out)

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = {}
