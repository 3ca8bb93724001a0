"""The memory limit the server itself runs under: the tightest limit on its own cgroup and the
ancestors it can see (a container's limit, a systemd slice's ``MemoryMax``), with what that
cgroup uses now. Every process sandbox's cgroup is nested below it, so this limit bounds all of
them together with the server (`sandbox.server.memory_budget` does the arithmetic).

Only reads; a hierarchy that is not mounted, or a value it cannot read, counts as no limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sandbox.backends.process.cgroups.discovery import own_dirs

__all__ = ["OwnMemory", "own_memory"]

# cgroup v1 spells "no limit" as the page counter's maximum (9223372036854771712 with 4 KiB
# pages); anything above 2**60 bytes is no limit in practice.
_UNLIMITED_V1 = 1 << 60


@dataclass(frozen=True)
class OwnMemory:
    limit_bytes: int  # the tightest limit found
    limit_path: Path  # the file that sets it
    usage_bytes: int | None  # what our own cgroup uses now (None where it does not say)


def own_memory() -> OwnMemory | None:
    """The memory limit over this process, or None when nothing limits it."""
    found = own_dirs("memory")  # a v1 memory hierarchy (also on a hybrid system)
    if found is not None:
        limit = _tightest(*found, "memory.limit_in_bytes")
        usage = _read_int(found[0] / "memory.usage_in_bytes")
    else:
        found = own_dirs("")
        if found is None:
            return None
        limit = _tightest(*found, "memory.max")
        usage = _read_int(found[0] / "memory.current")
    if limit is None:
        return None
    return OwnMemory(limit[0], limit[1], usage)


def _tightest(base: Path, mount_point: Path, name: str) -> tuple[int, Path] | None:
    """The smallest limit in ``name`` from ``base`` up to the mount point."""
    best: tuple[int, Path] | None = None
    directory = base
    while True:
        value = _read_int(directory / name)
        if value is not None and value < _UNLIMITED_V1 and (best is None or value < best[0]):
            best = (value, directory / name)
        if directory in (mount_point, directory.parent):
            return best
        directory = directory.parent


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2) is no limit
