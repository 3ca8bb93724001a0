"""Per-sandbox cgroups: limits and accounting for a sandbox *as a whole*, on cgroup v1 or v2.

This module owns every write to a cgroup filesystem. The process backend asks it for one fresh
cgroup per sandbox, nested under the server's own cgroup in a per-server parent directory
(``<prefix>-<server pid>-<n>``), puts the sandbox's first process into it, and later reads usage and
kills whatever is left. Limits set here bind all processes and threads of the sandbox together,
which per-process rlimits cannot do:

======================  ====================================  ===================================
limit / usage           cgroup v1                             cgroup v2
======================  ====================================  ===================================
memory (no swap)        memory.limit_in_bytes (+ memsw)       memory.max, memory.swap.max = 0
processes and threads   pids.max                              pids.max
CPU bandwidth           cpu.cfs_quota_us / cpu.cfs_period_us  cpu.max
CPU time used           cpuacct.usage                         cpu.stat usage_usec
peak memory             memory.max_usage_in_bytes             memory.peak
memory limit hit        memory.failcnt                        memory.events max
OOM kill happened       memory.oom_control oom_kill           memory.events oom_kill
fork refused            pids.events max                       pids.events max
peak processes          (none)                                pids.peak (Linux 6.1+)
kill everything         freezer.state + SIGKILL + thaw        cgroup.kill (else cgroup.freeze)
======================  ====================================  ===================================

It is hand-written on purpose: no well-kept Python library manages both v1 (one hierarchy per
controller, possibly co-mounted) and v2 (one unified tree with subtree_control), and the parts
that matter for a sandbox (write order of memsw, race-free kill, stale cleanup) are short.

:meth:`CgroupManager.detect` fails closed: it returns ``None`` and records a reason (not root, a
read-only cgroupfs, a missing controller, v2 controllers that cannot be delegated) when it cannot
actually create a cgroup and write its limits, so the backend can report that instead of running
sandboxes without whole-sandbox limits.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

__all__ = [
    "CgroupError",
    "CgroupLimits",
    "CgroupManager",
    "CgroupUsage",
    "SandboxCgroup",
]

_V1_REQUIRED = ("memory", "pids", "cpu", "cpuacct")
_V2_REQUIRED = ("memory", "pids", "cpu")
_CFS_PERIOD_US = 100_000
_CFS_MIN_QUOTA_US = 1_000
_KILL_TIMEOUT_S = 2.0
_FREEZE_TIMEOUT_S = 0.2
_RMDIR_TIMEOUT_S = 1.0
_INSTANCES = itertools.count(1)
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


class CgroupError(OSError):
    """A cgroup file could not be created, written, read or removed; the message names the path."""


@dataclass(frozen=True)
class CgroupLimits:
    """Whole-sandbox limits. ``cpu_cores`` of ``None`` means no CPU bandwidth cap."""

    memory_bytes: int
    pids: int
    cpu_cores: float | None

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0:
            raise ValueError(f"memory_bytes must be positive, got {self.memory_bytes}")
        if self.pids <= 0:
            raise ValueError(f"pids must be positive, got {self.pids}")
        if self.cpu_cores is not None and not self.cpu_cores > 0:
            raise ValueError(f"cpu_cores must be positive or None, got {self.cpu_cores}")


@dataclass(frozen=True)
class CgroupUsage:
    """What the sandbox used; every field covers all of its processes, dead or alive."""

    cpu_time_ns: int
    memory_peak_bytes: int
    oom_killed: bool
    pids_limit_hit: bool
    memory_limit_hits: int = 0  # charges that reached the limit (each one reclaimed or failed)
    pids_limit_hits: int = 0  # process or thread creations refused at pids.max
    peak_pids: int | None = None  # None where the kernel keeps no peak (v1, v2 before 6.1)


# -- file helpers: every OSError becomes a CgroupError naming the path --------------------------


def _fail(action: str, path: Path, exc: OSError) -> CgroupError:
    reason = exc.strerror or str(exc)
    return CgroupError(exc.errno or 0, f"cannot {action} {path}: {reason}")


def _read(path: Path | str) -> str:
    # os.open/os.read, not Path.read_text: a sandbox's start and end read a dozen of these
    # files, and the text-file machinery was a measurable part of the host's CPU per execution.
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.read(fd, 65536).decode()
        finally:
            os.close(fd)
    except OSError as exc:
        raise _fail("read", Path(path), exc) from exc


def _write(path: Path, value: str) -> None:
    # One write(2) per value: cgroup files take exactly one value (one pid) per write.
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        raise _fail(f"write {value!r} to", path, exc) from exc


def _keyed(path: Path) -> dict[str, int]:
    """Parse a flat keyed file (``key value`` per line), such as cpu.stat or pids.events."""
    out: dict[str, int] = {}
    for line in _read(path).splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


def _int_or_zero(path: Path) -> int:
    try:
        return int(_read(path).strip())
    except CgroupError as exc:
        if exc.errno == errno.ENOENT:
            return 0
        raise


# -- discovery --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Hierarchy:
    """One mounted hierarchy: where it is mounted and where our own cgroup sits in it."""

    key: str  # the controller field of /proc/<pid>/cgroup: "memory", "cpu,cpuacct", "" for v2
    controllers: frozenset[str]
    base: Path  # the directory of the current process's cgroup
    rel: str  # the same cgroup as /proc/self/cgroup spells it


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts() -> list[tuple[str, Path, str, set[str], bool]]:
    """(fstype, mount point, mount root, super options, read-only) of each cgroup mount."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        head, _, tail = line.partition(" - ")
        fields, tail_fields = head.split(), tail.split()
        if len(fields) < 6 or len(tail_fields) < 3 or tail_fields[0] not in ("cgroup", "cgroup2"):
            continue
        read_only = "ro" in fields[5].split(",")
        options = set(tail_fields[2].split(","))
        mounts.append((tail_fields[0], Path(_unescape(fields[4])), fields[3], options, read_only))
    return mounts


def _own_cgroups() -> dict[str, str]:
    """Controller field of /proc/self/cgroup → our cgroup path in that hierarchy."""
    own: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, key, path = line.split(":", 2)
        own[key] = path
    return own


def _base_dir(mount_point: Path, mount_root: str, rel: str) -> Path | None:
    if mount_root == "/":
        return mount_point / rel.lstrip("/")
    if rel == mount_root or rel.startswith(mount_root.rstrip("/") + "/"):
        return mount_point / rel[len(mount_root) :].lstrip("/")
    return None


def _find_v2() -> tuple[_Hierarchy | None, str]:
    own = _own_cgroups()
    if "" not in own:
        return None, "no cgroup v2 entry in /proc/self/cgroup"
    for fstype, point, root, _, read_only in _mounts():
        if fstype != "cgroup2":
            continue
        base = _base_dir(point, root, own[""])
        if base is None:
            continue
        if read_only:
            return None, f"cgroup v2 at {point} is mounted read-only"
        try:
            available = set((base / "cgroup.controllers").read_text().split())
        except OSError as exc:
            return None, f"cannot read {base / 'cgroup.controllers'}: {exc.strerror}"
        missing = [c for c in _V2_REQUIRED if c not in available]
        if missing:
            return None, f"cgroup v2 at {base} lacks controllers {', '.join(missing)}"
        return _Hierarchy("", frozenset(_V2_REQUIRED), base, own[""]), ""
    return None, "cgroup v2 is not mounted"


def _find_v1() -> tuple[list[_Hierarchy], str]:
    own = _own_cgroups()
    found: dict[str, _Hierarchy] = {}
    for fstype, point, root, options, read_only in _mounts():
        if fstype != "cgroup":
            continue
        wanted = options & {*_V1_REQUIRED, "freezer"}
        if not wanted or any(c in found for c in wanted):
            continue
        key = next((k for k in own if k and set(k.split(",")) & wanted), None)
        if key is None:
            continue
        if read_only and wanted == {"freezer"}:
            continue  # the freezer only makes kill_all tighter; SIGKILL rounds work without it
        if read_only:
            return [], f"cgroup v1 {','.join(sorted(wanted))} at {point} is mounted read-only"
        base = _base_dir(point, root, own[key])
        if base is None:
            return [], f"our cgroup {own[key]} is outside the mount {point} (root {root})"
        hierarchy = _Hierarchy(key, frozenset(wanted), base, own[key])
        for controller in wanted:
            found[controller] = hierarchy
    missing = [c for c in _V1_REQUIRED if c not in found]
    if missing:
        return [], f"cgroup v1 controllers not mounted: {', '.join(missing)}"
    unique = {h.base: h for h in found.values()}
    return list(unique.values()), ""


# -- one sandbox's cgroup ---------------------------------------------------------------------


class SandboxCgroup:
    """One sandbox's cgroup: a directory in each hierarchy (one on v2, one per mount on v1)."""

    def __init__(
        self, version: Literal[1, 2], dirs: dict[str, Path], keys: dict[Path, tuple[str, str]]
    ) -> None:
        self.version: Literal[1, 2] = version
        self._dirs = dirs  # controller ("memory", "pids", "cpu", "cpuacct", "freezer") → directory
        self._keys = keys  # directory → (controller field of /proc/<pid>/cgroup, cgroup path)
        self._removed = False
        self._memory_limit: int | None = None  # as we last wrote it (v1)
        self._memsw: bool | None = None  # swap accounting (v1), looked up once
        self._period_set = False

    @property
    def paths(self) -> list[Path]:
        """The cgroup's directories, one per hierarchy."""
        return list(self._keys)

    def _dir(self, controller: str) -> Path:
        return self._dirs[controller]

    def set_limits(self, limits: CgroupLimits) -> None:
        """Write all limits; may be called again (before the job starts) to raise or lower them."""
        if self.version == 2:
            self._set_limits_v2(limits)
        else:
            self._set_limits_v1(limits)

    def _set_limits_v2(self, limits: CgroupLimits) -> None:
        d = self._dir("memory")
        _write(d / "memory.max", str(limits.memory_bytes))
        if (d / "memory.swap.max").exists():
            _write(d / "memory.swap.max", "0")
        _write(d / "pids.max", str(limits.pids))
        if limits.cpu_cores is None:
            _write(d / "cpu.max", f"max {_CFS_PERIOD_US}")
        else:
            _write(d / "cpu.max", f"{_cfs_quota_us(limits.cpu_cores)} {_CFS_PERIOD_US}")

    def _set_limits_v1(self, limits: CgroupLimits) -> None:
        mem = self._dir("memory")
        limit, memsw = mem / "memory.limit_in_bytes", mem / "memory.memsw.limit_in_bytes"
        value = str(limits.memory_bytes)
        if self._has_memsw():
            # The kernel keeps memsw >= memory at every step, so the order depends on direction
            # (a new cgroup's limit is unlimited: lowering it).
            current = self._memory_limit
            if current is None:
                current = int(_read(limit).strip())
            if limits.memory_bytes <= current:
                _write(limit, value)
                _write(memsw, value)
            else:
                _write(memsw, value)
                _write(limit, value)
        else:
            # Without swap accounting, swappiness 0 is what keeps a v1 memcg out of swap.
            _write(limit, value)
            _write(mem / "memory.swappiness", "0")
        self._memory_limit = limits.memory_bytes
        _write(self._dir("pids") / "pids.max", str(limits.pids))
        cpu = self._dir("cpu")
        if not self._period_set:  # a new cgroup's period is the kernel's default, not ours
            _write(cpu / "cpu.cfs_period_us", str(_CFS_PERIOD_US))
            self._period_set = True
        quota = -1 if limits.cpu_cores is None else _cfs_quota_us(limits.cpu_cores)
        _write(cpu / "cpu.cfs_quota_us", str(quota))

    def _has_memsw(self) -> bool:
        if self._memsw is None:
            self._memsw = (self._dir("memory") / "memory.memsw.limit_in_bytes").exists()
        return self._memsw

    def add_pids(self, pids: Iterable[int]) -> None:
        """Move each process (with all its threads) into this cgroup in every hierarchy."""
        for pid in pids:
            for d in self._keys:
                _write(d / "cgroup.procs", str(pid))

    def usage(self) -> CgroupUsage:
        """Totals since creation; read after the sandbox has ended for final figures."""
        if self.version == 2:
            d = self._dir("memory")
            events = _keyed(d / "memory.events")
            refused = _keyed(d / "pids.events").get("max", 0)
            return CgroupUsage(
                cpu_time_ns=_keyed(d / "cpu.stat").get("usage_usec", 0) * 1000,
                memory_peak_bytes=_int_or_zero(d / "memory.peak"),
                oom_killed=events.get("oom_kill", 0) > 0,
                pids_limit_hit=refused > 0,
                memory_limit_hits=events.get("max", 0),
                pids_limit_hits=refused,
                peak_pids=_int_or_zero(d / "pids.peak") if (d / "pids.peak").exists() else None,
            )
        mem = self._dir("memory")
        peak = _int_or_zero(mem / "memory.max_usage_in_bytes")
        oom = _keyed(mem / "memory.oom_control")
        failcnt = _int_or_zero(mem / "memory.failcnt")
        if "oom_kill" in oom:
            oom_killed = oom["oom_kill"] > 0
        else:
            # Kernels before 4.13 have no counter: infer it from hitting the limit or a stuck OOM.
            at_limit = peak >= _int_or_zero(mem / "memory.limit_in_bytes")
            oom_killed = oom.get("under_oom", 0) > 0 or (failcnt > 0 and at_limit)
        refused = _keyed(self._dir("pids") / "pids.events").get("max", 0)
        return CgroupUsage(
            cpu_time_ns=_int_or_zero(self._dir("cpuacct") / "cpuacct.usage"),
            memory_peak_bytes=peak,
            oom_killed=oom_killed,
            pids_limit_hit=refused > 0,
            memory_limit_hits=failcnt,
            pids_limit_hits=refused,
        )

    def pids(self) -> list[int]:
        """Every process in the cgroup, in any hierarchy (thread ids are not listed)."""
        found: set[int] = set()
        for d in self._keys:
            try:
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise _fail("read", d / "cgroup.procs", exc) from exc
        return sorted(found)

    def kill_all(self) -> None:
        """SIGKILL every process, also those forked meanwhile; raise if any survive ~2 s."""
        deadline = time.monotonic() + _KILL_TIMEOUT_S
        kill_file = self._dir("memory") / "cgroup.kill" if self.version == 2 else None
        while True:
            survivors = self.pids()
            if not survivors:
                return
            if time.monotonic() > deadline:
                raise CgroupError(
                    errno.EBUSY,
                    f"processes {survivors} survived SIGKILL in {', '.join(map(str, self._keys))}",
                )
            if kill_file is not None and kill_file.exists():
                _write(kill_file, "1")
            else:
                frozen = self._freeze()
                try:
                    for pid in self.pids():
                        self._kill_member(pid)
                finally:
                    if frozen:
                        self._thaw()
            time.sleep(0.01)

    def _freeze(self) -> bool:
        """Stop every task so none can fork while we signal; False if there is no freezer."""
        if self.version == 2:
            state = self._dir("memory") / "cgroup.freeze"
            if not state.exists():
                return False
            _write(state, "1")
        elif "freezer" in self._dirs:
            _write(self._dir("freezer") / "freezer.state", "FROZEN")
        else:
            return False
        # A task in uninterruptible sleep can hold the freeze back; SIGKILL still helps then.
        until = time.monotonic() + _FREEZE_TIMEOUT_S
        while not self._frozen() and time.monotonic() < until:
            time.sleep(0.002)
        return True

    def _frozen(self) -> bool:
        if self.version == 2:
            return "frozen 1" in _read(self._dir("memory") / "cgroup.events").splitlines()
        return _read(self._dir("freezer") / "freezer.state").strip() == "FROZEN"

    def _thaw(self) -> None:
        if self.version == 2:
            _write(self._dir("memory") / "cgroup.freeze", "0")
        else:
            _write(self._dir("freezer") / "freezer.state", "THAWED")

    def _kill_member(self, pid: int) -> None:
        """SIGKILL ``pid`` only if it is still ours: a pid read from cgroup.procs may be reused."""
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return  # already gone
        try:
            # The pidfd pins the process, so this membership check is about the one we signal.
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
            ours = {f"{key}:{rel}" for key, rel in self._keys.values()}
            if any(line.split(":", 1)[1] in ours for line in lines):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except (ProcessLookupError, FileNotFoundError):
            pass
        except OSError as exc:
            raise _fail(f"kill process {pid} of", next(iter(self._keys)), exc) from exc
        finally:
            os.close(pidfd)

    def remove(self) -> None:
        """Kill everything, then remove the directory in every hierarchy; safe to call twice."""
        if self._removed:
            return
        # The usual case is a sandbox whose processes are all gone: try the removal at once
        # (the kernel refuses to remove a cgroup that still holds a process), and only
        # otherwise kill, wait and retry.
        if not self._try_rmdir_all():
            if any(d.exists() for d in self._keys):
                self.kill_all()
            for d in self._keys:
                _rmdir(d)
        self._removed = True

    def _try_rmdir_all(self) -> bool:
        for d in self._keys:
            try:
                os.rmdir(d)
            except FileNotFoundError:
                continue
            except OSError:
                return False
        return True


def _cfs_quota_us(cores: float) -> int:
    return max(_CFS_MIN_QUOTA_US, round(cores * _CFS_PERIOD_US))


def _rmdir(path: Path) -> None:
    # A cgroup can stay busy for a moment after its last task has exited.
    until = time.monotonic() + _RMDIR_TIMEOUT_S
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > until:
                raise _fail("remove", path, exc) from exc
        time.sleep(0.01)


# -- the manager ------------------------------------------------------------------------------


class CgroupManager:
    """Creates sandbox cgroups under ``<own cgroup>/<prefix>-<pid>-<n>`` in each hierarchy."""

    _unavailable: ClassVar[str | None] = None
    _live_parents: ClassVar[set[str]] = set()
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, version: Literal[1, 2], hierarchies: list[_Hierarchy], prefix: str) -> None:
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
            v2, v2_reason = _find_v2()
            v1, v1_reason = ([], "") if v2 is not None else _find_v1()
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
            self._enable_controllers(base)
        for parent in self.parent_paths:
            if parent.exists():
                # Our pid, but no live manager of ours holds it: left by an earlier process.
                self._remove_named_parent(parent.name)
            try:
                parent.mkdir()
            except OSError as exc:
                raise _fail("create", parent, exc) from exc
        if self.version == 2:
            self._enable_controllers(self.parent_paths[0])

    @staticmethod
    def _enable_controllers(directory: Path) -> None:
        enabled = set(_read(directory / "cgroup.subtree_control").split())
        missing = [c for c in _V2_REQUIRED if c not in enabled]
        if not missing:
            return
        try:
            _write(directory / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))
        except CgroupError as exc:
            if exc.errno != errno.EBUSY:
                raise
            # v2's no-internal-process rule: a cgroup that holds processes (ours, here) cannot
            # hand controllers to children. The operator must start the server in a leaf of a
            # delegated subtree (systemd Delegate=yes, or move PID 1 of a container to a child).
            raise CgroupError(
                errno.EBUSY,
                f"{exc.strerror}: {directory} holds processes, so v2 cannot delegate"
                f" {', '.join(missing)} to its children; run the server in a delegated subtree",
            ) from exc

    def create(self, name: str) -> SandboxCgroup:
        """A fresh, empty cgroup for one sandbox; fails if ``name`` is already in use."""
        if self._closed:
            raise CgroupError(errno.ESHUTDOWN, f"cgroup manager {self._name} is closed")
        if not _NAME_RE.fullmatch(name):
            raise ValueError(f"bad cgroup name {name!r}")
        cgroup = self._sandbox(name)
        made: list[Path] = []
        try:
            for d in cgroup.paths:
                d.mkdir()
                made.append(d)
        except OSError as exc:
            for d in reversed(made):
                _rmdir(d)
            raise _fail("create", d, exc) from exc
        return cgroup

    def _sandbox(self, name: str, parent_name: str | None = None) -> SandboxCgroup:
        parent_name = parent_name or self._name
        dirs: dict[str, Path] = {}
        keys: dict[Path, tuple[str, str]] = {}
        for h in self._hierarchies:
            d = h.base / parent_name / name
            keys[d] = (h.key, f"{h.rel.rstrip('/')}/{parent_name}/{name}")
            for controller in h.controllers:
                dirs[controller] = d
        return SandboxCgroup(self.version, dirs, keys)

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
                raise _fail("list", h.base, exc) from exc
            for entry in entries:
                match = pattern.fullmatch(entry.name)
                if match and entry.is_dir() and not _pid_alive(int(match.group(1))):
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
            _rmdir(h.base / parent_name)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
