"""Reading and writing cgroup files: every OSError becomes a `CgroupError` naming the path."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

__all__ = ["CgroupError", "fail", "int_or_zero", "keyed", "pid_alive", "read", "rmdir", "write"]

_RMDIR_TIMEOUT_S = 1.0


class CgroupError(OSError):
    """A cgroup file could not be created, written, read or removed; the message names the path."""


def fail(action: str, path: Path | str, exc: OSError) -> CgroupError:
    reason = exc.strerror or str(exc)
    return CgroupError(exc.errno or 0, f"cannot {action} {path}: {reason}")


def read(path: Path | str) -> str:
    # os.open/os.read, not Path.read_text: a sandbox's start and end read a dozen of these
    # files, and the text-file machinery was a measurable part of the host's CPU per execution.
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.read(fd, 65536).decode()
        finally:
            os.close(fd)
    except OSError as exc:
        raise fail("read", Path(path), exc) from exc


def write(path: Path | str, value: str) -> None:
    # One write(2) per value: cgroup files take exactly one value (one pid) per write.
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        raise fail(f"write {value!r} to", path, exc) from exc


def keyed(path: Path | str) -> dict[str, int]:
    """Parse a flat keyed file (``key value`` per line), such as cpu.stat or pids.events."""
    out: dict[str, int] = {}
    for line in read(path).splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


def int_or_zero(path: Path | str) -> int:
    try:
        return int(read(path).strip())
    except CgroupError as exc:
        if exc.errno == errno.ENOENT:
            return 0
        raise


def rmdir(path: Path | str) -> None:
    # A cgroup can stay busy for a moment after its last task has exited.
    until = time.monotonic() + _RMDIR_TIMEOUT_S
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > until:
                raise fail("remove", path, exc) from exc
        time.sleep(0.01)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
