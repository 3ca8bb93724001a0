"""Creates sandbox cgroups under ``<own cgroup>/<prefix>-<pid>-<n>`` in each hierarchy, probes
that it really can (fail closed), and removes what it or a dead earlier server left."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import threading
from pathlib import Path
from typing import ClassVar, Literal

from sandbox.backends.process.cgroups.controls import CgroupLimits
from sandbox.backends.process.cgroups.discovery import Hierarchy, find_v1, find_v2
from sandbox.backends.process.cgroups.files import CgroupError, fail, pid_alive, rmdir
from sandbox.backends.process.cgroups.sandbox_cgroup import SandboxCgroup
from sandbox.backends.process.cgroups.v2 import enable_controllers

__all__ = ["CgroupManager"]

_INSTANCES = itertools.count(1)
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


class CgroupManager:
    """Creates sandbox cgroups under ``<own cgroup>/<prefix>-<pid>-<n>`` in each hierarchy."""

    _unavailable: ClassVar[str | None] = None
    _live_parents: ClassVar[set[str]] = set()
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, version: Literal[1, 2], hierarchies: list[Hierarchy], prefix: str) -> None:
        self.version: Literal[1, 2] = version
        self.prefix = prefix
        self._hierarchies = hierarchies
        # One parent per manager: several backends may live in one process (tests, a server
        # and a benchmark), each with its own parent directory.
        self._name = f"{prefix}-{os.getpid()}-{next(_INSTANCES)}"
        self._freezer = version == 2 or any("freezer" in h.controllers for h in hierarchies)
        self._closed = False

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why the last :meth:`detect` returned ``None``; ``None`` if it succeeded."""
        return cls._unavailable

    @classmethod
    def detect(cls, prefix: str = "ptc") -> CgroupManager | None:
        """A manager if we can create cgroups with memory, pids and cpu accounting, else None.

        Probes for real: creates the parent directory and a throw-away child with limits.
        Two live managers in one process need different prefixes.
        """
        if not _NAME_RE.fullmatch(prefix):
            raise ValueError(f"bad cgroup prefix {prefix!r}")
        manager, reason = cls._probe(prefix)
        cls._unavailable = None if manager else reason
        return manager

    @classmethod
    def _probe(cls, prefix: str) -> tuple[CgroupManager | None, str]:
        if not Path("/proc/self/cgroup").exists():
            return None, "no /proc/self/cgroup: not Linux or /proc is not mounted"
        try:
            v2, v2_reason = find_v2()
            v1, v1_reason = ([], "") if v2 is not None else find_v1()
        except OSError as exc:
            return None, f"cannot read /proc/self/mountinfo or /proc/self/cgroup: {exc}"
        if v2 is not None:
            manager = cls(2, [v2], prefix)
        elif v1:
            manager = cls(1, v1, prefix)
        else:
            return None, f"{v1_reason}; {v2_reason}"
        with cls._lock:
            if manager._name in cls._live_parents:
                raise CgroupError(errno.EEXIST, f"a live manager already uses {manager._name}")
            cls._live_parents.add(manager._name)
        try:
            manager._open()
            probe = manager.create(f"probe-{os.getpid()}")
            try:
                probe.set_limits(CgroupLimits(memory_bytes=1 << 30, pids=64, cpu_cores=1.0))
                probe.usage()
            finally:
                probe.remove()
        except CgroupError as exc:
            with cls._lock:
                cls._live_parents.discard(manager._name)
            # The first error is the one that explains the failure.
            with contextlib.suppress(CgroupError):
                manager._remove_parents()
            hint = "" if os.geteuid() == 0 else " (not running as root)"
            return None, f"cgroup v{manager.version} not writable{hint}: {exc}"
        return manager, ""

    @property
    def parent_paths(self) -> list[Path]:
        """This manager's parent directory in each hierarchy."""
        return [h.base / self._name for h in self._hierarchies]

    def _open(self) -> None:
        if self.version == 2:
            base = self._hierarchies[0].base
            enable_controllers(base)
        for parent in self.parent_paths:
            if parent.exists():
                # Our pid, but no live manager of ours holds it: left by an earlier process.
                self._remove_named_parent(parent.name)
            try:
                parent.mkdir()
            except OSError as exc:
                raise fail("create", parent, exc) from exc
        if self.version == 2:
            enable_controllers(self.parent_paths[0])

    def create(self, name: str) -> SandboxCgroup:
        """A fresh, empty cgroup for one sandbox; fails if ``name`` is already in use."""
        if self._closed:
            raise CgroupError(errno.ESHUTDOWN, f"cgroup manager {self._name} is closed")
        if not _NAME_RE.fullmatch(name):
            raise ValueError(f"bad cgroup name {name!r}")
        cgroup = self._sandbox(name, new=True)
        made: list[str] = []
        try:
            for d in cgroup.dirs:
                os.mkdir(d)
                made.append(d)
        except OSError as exc:
            for d in reversed(made):
                rmdir(d)
            raise fail("create", d, exc) from exc
        return cgroup

    def _sandbox(
        self, name: str, parent_name: str | None = None, *, new: bool = False
    ) -> SandboxCgroup:
        parent_name = parent_name or self._name
        dirs: dict[str, str] = {}
        keys: dict[str, tuple[str, str]] = {}
        for h in self._hierarchies:
            # Strings, not Paths: a sandbox's start builds a dozen of these (bench.forkserver).
            d = f"{h.base}/{parent_name}/{name}"
            keys[d] = (h.key, f"{h.rel.rstrip('/')}/{parent_name}/{name}")
            for controller in h.controllers:
                dirs[controller] = d
        return SandboxCgroup(self.version, dirs, keys, new=new)

    def layers(self) -> list[str]:
        """The enforcement layers this manager provides, for health and outcome reports."""
        layers = [f"cgroup:v{self.version}", "cgroup:memory", "cgroup:pids", "cgroup:cpu"]
        if self._freezer:
            layers.append("cgroup:freezer")
        return layers

    def cleanup_stale(self) -> int:
        """Kill and remove what a dead earlier server left (``<prefix>-<dead pid>``); count them."""
        pattern = re.compile(re.escape(self.prefix) + r"-([0-9]+)(?:-[0-9]+)?")
        stale: set[str] = set()
        for h in self._hierarchies:
            try:
                entries = list(h.base.iterdir())
            except OSError as exc:
                raise fail("list", h.base, exc) from exc
            for entry in entries:
                match = pattern.fullmatch(entry.name)
                if match and entry.is_dir() and not pid_alive(int(match.group(1))):
                    stale.add(entry.name)
        for name in sorted(stale):
            self._remove_named_parent(name)
        return len(stale)

    def close(self) -> None:
        """Remove the parent directory, killing and removing any sandbox cgroup still in it."""
        if self._closed:
            return
        self._remove_parents()
        self._closed = True
        with self._lock:
            self._live_parents.discard(self._name)

    def _remove_parents(self) -> None:
        self._remove_named_parent(self._name)

    def _remove_named_parent(self, parent_name: str) -> None:
        children: set[str] = set()
        for h in self._hierarchies:
            parent = h.base / parent_name
            if parent.is_dir():
                children.update(p.name for p in parent.iterdir() if p.is_dir())
        for child in sorted(children):
            self._sandbox(child, parent_name).remove()
        for h in self._hierarchies:
            rmdir(h.base / parent_name)
