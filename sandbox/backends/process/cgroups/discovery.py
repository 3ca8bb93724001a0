"""Finding the cgroup hierarchies: which are mounted, writable, with the controllers we need,
and where the current process's own cgroup sits in each (/proc/self/mountinfo, /proc/self/cgroup).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sandbox.backends.process.cgroups.v1 import REQUIRED as V1_REQUIRED
from sandbox.backends.process.cgroups.v2 import REQUIRED as V2_REQUIRED

__all__ = ["Hierarchy", "find_v1", "find_v2", "own_dirs"]


@dataclass(frozen=True)
class Hierarchy:
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


def find_v2() -> tuple[Hierarchy | None, str]:
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
        missing = [c for c in V2_REQUIRED if c not in available]
        if missing:
            return None, f"cgroup v2 at {base} lacks controllers {', '.join(missing)}"
        return Hierarchy("", frozenset(V2_REQUIRED), base, own[""]), ""
    return None, "cgroup v2 is not mounted"


def find_v1() -> tuple[list[Hierarchy], str]:
    own = _own_cgroups()
    found: dict[str, Hierarchy] = {}
    for fstype, point, root, options, read_only in _mounts():
        if fstype != "cgroup":
            continue
        wanted = options & {*V1_REQUIRED, "freezer"}
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
        hierarchy = Hierarchy(key, frozenset(wanted), base, own[key])
        for controller in wanted:
            found[controller] = hierarchy
    missing = [c for c in V1_REQUIRED if c not in found]
    if missing:
        return [], f"cgroup v1 controllers not mounted: {', '.join(missing)}"
    unique = {h.base: h for h in found.values()}
    return list(unique.values()), ""


def own_dirs(controller: str) -> tuple[Path, Path] | None:
    """(our cgroup's directory, its mount point) in the hierarchy holding ``controller`` ("" for
    the v2 unified tree), read-only mounts included; None where that hierarchy is not mounted
    or our cgroup is outside the mount. Reading only: it is for looking at our own limits."""
    own = _own_cgroups()
    for fstype, point, root, options, _ in _mounts():
        if controller == "" and fstype == "cgroup2" and "" in own:
            rel = own[""]
        elif controller and fstype == "cgroup" and controller in options:
            key = next((k for k in own if controller in k.split(",")), None)
            if key is None:
                continue
            rel = own[key]
        else:
            continue
        base = _base_dir(point, root, rel)
        if base is not None:
            return base, point
    return None
