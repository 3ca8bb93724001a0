"""Reading a running container's cgroup counters from the host (cgroup v1 and v2).

The Docker engine enforces the limits; this module only reads what the kernel accounted, because
the engine's stats API is far too slow to poll every 50 ms and reports nothing once the container
has exited (its cgroup is removed with it). Readable only when the server runs on the engine's
host, in its pid namespace; otherwise `ContainerCgroup.locate` returns None and the backend does
without (no whole-sandbox CPU watchdog, memory peaks unknown).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from sandbox.backends.docker.oom_watch import OomNotifier

__all__ = ["CgroupCounters", "ContainerCgroup"]

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class CgroupCounters:
    cpu_time_ns: int = 0
    memory_peak_bytes: int = 0
    oom_kills: int = 0
    pids_max_events: int = 0
    memory_limit_hits: int = 0  # v1 memory.failcnt, v2 memory.events max
    pids_peak: int | None = None  # v2 pids.peak (Linux 6.1+)

    def then(self, later: CgroupCounters) -> CgroupCounters:
        """This sample followed by ``later``: every counter only grows, so each is the larger
        of the two. A sample taken while runc removes the container's cgroups reads some
        hierarchies already gone, as zero (the pids one before the cpuacct one, say); it must
        not wipe out what an earlier sample saw (a refused fork, an OOM kill)."""
        peaks = [p for p in (self.pids_peak, later.pids_peak) if p is not None]
        return CgroupCounters(
            cpu_time_ns=max(self.cpu_time_ns, later.cpu_time_ns),
            memory_peak_bytes=max(self.memory_peak_bytes, later.memory_peak_bytes),
            oom_kills=max(self.oom_kills, later.oom_kills),
            pids_max_events=max(self.pids_max_events, later.pids_max_events),
            memory_limit_hits=max(self.memory_limit_hits, later.memory_limit_hits),
            pids_peak=max(peaks) if peaks else None,
        )


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _keyed(text: str | None, key: str) -> int:
    """The value of ``key`` in a flat-keyed cgroup file (`oom_kill 1`)."""
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            with contextlib.suppress(ValueError):
                return int(value)
    return 0


def _int(text: str | None) -> int:
    try:
        return int((text or "").strip() or 0)
    except ValueError:
        return 0


class ContainerCgroup:
    """The cgroup directories of one container, found through its init process."""

    def __init__(self, dirs: dict[str, Path], unified: bool) -> None:
        self._dirs = dirs
        self.unified = unified

    @classmethod
    def locate(
        cls, pid: int, container_id: str, root: Path = CGROUP_ROOT
    ) -> ContainerCgroup | None:
        """The cgroup of host process ``pid``, if it is this container's (else None)."""
        text = _read(Path(f"/proc/{pid}/cgroup"))
        if not text or container_id not in text:
            return None
        v1: dict[str, Path] = {}
        v2: Path | None = None
        for line in text.splitlines():
            _hier, controllers, path = line.split(":", 2)
            if container_id not in path:
                continue
            relative = path.lstrip("/")
            if controllers == "":
                v2 = root / relative
            for controller in controllers.split(","):
                if controller in ("cpuacct", "memory", "pids"):
                    v1[controller] = root / controllers / relative
        if {"cpuacct", "memory", "pids"} <= v1.keys():
            return cls(v1, unified=False)
        if v2 is not None and (v2 / "cgroup.controllers").exists():
            return cls({"cpuacct": v2, "memory": v2, "pids": v2}, unified=True)
        return None

    def oom_notifier(self) -> OomNotifier | None:
        """A descriptor the kernel signals when this cgroup runs out of memory, before the OOM
        killer acts (`sandbox.backends.docker.oom_watch`); None where it cannot be had (the
        cgroup already gone, no permission to register)."""
        memory = self._dirs["memory"]
        if self.unified:
            try:
                fd = os.open(memory / "memory.events", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            notifier = OomNotifier(fd, eventfd=False)
            if not notifier.rearm():  # read once: only a change from here on is a notice
                notifier.close()
                return None
            return notifier
        # cgroup v1: "<eventfd> <fd of memory.oom_control>" written to cgroup.event_control
        # registers the eventfd for the OOM notification (the kernel keeps no hold on the
        # control file's descriptor once the write returns).
        efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        try:
            control = os.open(memory / "memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
            try:
                (memory / "cgroup.event_control").write_text(f"{efd} {control}")
            finally:
                os.close(control)
        except OSError:
            os.close(efd)
            return None
        return OomNotifier(efd, eventfd=True)

    def exists(self) -> bool:
        return self._dirs["pids"].is_dir()

    def read(self) -> CgroupCounters | None:
        """The counters now; None once the cgroup is gone (the container has exited)."""
        cpu, memory, pids = self._dirs["cpuacct"], self._dirs["memory"], self._dirs["pids"]
        if self.unified:
            cpu_stat = _read(cpu / "cpu.stat")
            if cpu_stat is None:
                return None
            peak = _read(memory / "memory.peak") or _read(memory / "memory.current")
            events = _read(memory / "memory.events")
            pids_peak = _read(pids / "pids.peak")
            return CgroupCounters(
                cpu_time_ns=_keyed(cpu_stat, "usage_usec") * 1000,
                memory_peak_bytes=_int(peak),
                oom_kills=_keyed(events, "oom_kill"),
                pids_max_events=_keyed(_read(pids / "pids.events"), "max"),
                memory_limit_hits=_keyed(events, "max"),
                pids_peak=None if pids_peak is None else _int(pids_peak),
            )
        usage = _read(cpu / "cpuacct.usage")
        if usage is None:
            return None
        return CgroupCounters(
            cpu_time_ns=_int(usage),
            memory_peak_bytes=_int(_read(memory / "memory.max_usage_in_bytes")),
            oom_kills=_keyed(_read(memory / "memory.oom_control"), "oom_kill"),
            pids_max_events=_keyed(_read(pids / "pids.events"), "max"),
            memory_limit_hits=_int(_read(memory / "memory.failcnt")),
        )
