"""The OOM kills of the cgroup the server runs in (a pod, a container), read-only.

Where a sandbox has no memory cgroup of its own (the degraded process backend), its processes
live in the server's cgroup, and when that cgroup (or an ancestor: the pod's) reaches its limit
the kernel's OOM killer takes a process there: a sandbox process first, since each one volunteers
(`oom_score_adj` 1000). The cgroup filesystem may be read-only, but its counters are readable:
``oom_kill`` in ``memory.oom_control`` (v1) or ``memory.events`` (v2), at our own cgroup and each
ancestor up to the mount point (v1 counts a kill at the cgroup whose limit was hit; v2 at that
cgroup and its ancestors). A rise of their sum while a sandbox lived, together with that
sandbox's SIGKILL death that the host did not cause, is the kernel's word that it killed the
sandbox for the enclosing cgroup's memory (`sandbox.execution.evidence`).
"""

from __future__ import annotations

from pathlib import Path

from sandbox.backends.process.cgroups.discovery import own_dirs

__all__ = ["EnclosingOomCounter"]


class EnclosingOomCounter:
    """Sums ``oom_kill`` over the counter files of our cgroup and its ancestors."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files

    @classmethod
    def find(cls) -> EnclosingOomCounter | None:
        """The counter over this process's memory cgroup, or None where no readable one exists
        (no memory hierarchy mounted, or a kernel older than the ``oom_kill`` line)."""
        found = own_dirs("memory")
        name = "memory.oom_control"
        if found is None:
            found = own_dirs("")
            name = "memory.events"
        if found is None:
            return None
        base, mount_point = found
        files: list[Path] = []
        directory = base
        while True:
            if _oom_kills(directory / name) is not None:
                files.append(directory / name)
            if directory in (mount_point, directory.parent):
                break
            directory = directory.parent
        return cls(files) if files else None

    def read(self) -> int:
        """The OOM kills counted so far (a file that became unreadable counts 0)."""
        return sum(_oom_kills(path) or 0 for path in self.files)


def _oom_kills(path: Path) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None
