"""One sandbox's cgroup: a directory in each hierarchy (one on v2, one per mount on v1). It moves
processes in, reads usage, kills every member race-free and removes itself; what differs between
versions it asks its `CgroupControls`."""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from sandbox.backends.process.cgroups.controls import CgroupControls, CgroupLimits, CgroupUsage
from sandbox.backends.process.cgroups.files import CgroupError, fail, read, rmdir, write
from sandbox.backends.process.cgroups.v1 import V1Controls
from sandbox.backends.process.cgroups.v2 import V2Controls

__all__ = ["SandboxCgroup"]

_KILL_TIMEOUT_S = 2.0
_FREEZE_TIMEOUT_S = 0.2


class SandboxCgroup:
    """One sandbox's cgroup: a directory in each hierarchy (one on v2, one per mount on v1)."""

    def __init__(
        self,
        version: Literal[1, 2],
        dirs: dict[str, str],
        keys: dict[str, tuple[str, str]],
        *,
        new: bool = False,
    ) -> None:
        """``new``: its directories were just made (`CgroupManager.create`)."""
        self.version: Literal[1, 2] = version
        self._controls: CgroupControls = (
            V2Controls(dirs) if version == 2 else V1Controls(dirs, new=new)
        )
        self._keys = keys  # directory → (controller field of /proc/<pid>/cgroup, cgroup path)
        self._removed = False

    @property
    def dirs(self) -> list[str]:
        """The cgroup's directories, one per hierarchy, as strings (the hot path's)."""
        return list(self._keys)

    @property
    def paths(self) -> list[Path]:
        """The cgroup's directories, one per hierarchy."""
        return [Path(d) for d in self._keys]

    def set_limits(self, limits: CgroupLimits) -> None:
        """Write all limits; may be called again (before the job starts) to raise or lower them."""
        self._controls.set_limits(limits)

    def add_pids(self, pids: Iterable[int]) -> None:
        """Move each process (with all its threads) into this cgroup in every hierarchy."""
        for pid in pids:
            for d in self._keys:
                write(f"{d}/cgroup.procs", str(pid))

    def usage(self) -> CgroupUsage:
        """Totals since creation; read after the sandbox has ended for final figures."""
        return self._controls.usage()

    def pids(self) -> list[int]:
        """Every process in the cgroup, in any hierarchy (thread ids are not listed)."""
        found: set[int] = set()
        for d in self._keys:
            try:
                found.update(int(p) for p in read(f"{d}/cgroup.procs").split())
            except CgroupError as exc:
                if exc.errno == errno.ENOENT:
                    continue
                raise
        return sorted(found)

    def kill_all(self) -> None:
        """SIGKILL every process, also those forked meanwhile; raise if any survive ~2 s."""
        deadline = time.monotonic() + _KILL_TIMEOUT_S
        while True:
            survivors = self.pids()
            if not survivors:
                return
            if time.monotonic() > deadline:
                raise CgroupError(
                    errno.EBUSY,
                    f"processes {survivors} survived SIGKILL in {', '.join(map(str, self._keys))}",
                )
            kill_file = self._controls.kill_file()
            if kill_file is not None:
                write(kill_file, "1")
            else:
                frozen = self._freeze()
                try:
                    for pid in self.pids():
                        self._kill_member(pid)
                finally:
                    if frozen:
                        self._controls.thaw()
            time.sleep(0.01)

    def _freeze(self) -> bool:
        """Stop every task so none can fork while we signal; False if there is no freezer."""
        if not self._controls.freeze():
            return False
        # A task in uninterruptible sleep can hold the freeze back; SIGKILL still helps then.
        until = time.monotonic() + _FREEZE_TIMEOUT_S
        while not self._controls.frozen() and time.monotonic() < until:
            time.sleep(0.002)
        return True

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
            raise fail(f"kill process {pid} of", next(iter(self._keys)), exc) from exc
        finally:
            os.close(pidfd)

    def remove(self) -> None:
        """Kill everything, then remove the directory in every hierarchy; safe to call twice."""
        # The usual case is a sandbox whose processes are all gone: try the removal at once
        # (the kernel refuses to remove a cgroup that still holds a process), and only
        # otherwise kill, wait and retry.
        if self.try_remove():
            return
        if any(os.path.exists(d) for d in self._keys):
            self.kill_all()
        for d in self._keys:
            rmdir(d)
        self._removed = True

    def try_remove(self) -> bool:
        """Removes the directory in every hierarchy if the kernel lets it at once (no process
        left, nothing busy); False, with what it could not remove still there, otherwise."""
        if not self._removed and self._try_rmdir_all():
            self._removed = True
        return self._removed

    def _try_rmdir_all(self) -> bool:
        for d in self._keys:
            try:
                os.rmdir(d)
            except FileNotFoundError:
                continue
            except OSError:
                return False
        return True
