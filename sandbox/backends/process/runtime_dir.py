"""The guest files on the host, and the janitor for what a dead server left of them.

Each backend copies the guest files into a directory of its own, named after its server's pid
(``ptc-runtime-<pid>-<random>``), readable by the unprivileged sandbox uid and mounted read-only
into every sandbox. A server that was killed cannot remove its directory, and a sandbox it was
starting at that moment (bwrap still waiting to be released into its cgroup) is outside any
cgroup the cgroup janitor could sweep; both are found through that name: a process whose command
line mounts the directory of a dead pid is killed, then the directory goes.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

import psutil

from sandbox.guest import (
    FORK_LOOP_FILE,
    GUEST_DIR,
    GUEST_FILES,
    ZYGOTE_FILES,
    fork_loop_library,
)

__all__ = ["make_runtime_dir", "sweep_stale_runtime_dirs"]

PREFIX = "ptc-runtime-"
_NAME = re.compile(re.escape(PREFIX) + r"([0-9]+)-")


def _parent() -> Path:
    # The sandbox uid must traverse the parent: a private $TMPDIR would not do.
    parent = Path(tempfile.gettempdir())
    if not parent.stat().st_mode & stat.S_IXOTH:
        parent = Path("/tmp")
    return parent


def make_runtime_dir(native_fork_loop: bool = True) -> Path:
    """Copies the guest files where the unprivileged sandbox uid can read them; with
    ``native_fork_loop``, the zygote's fork loop in C too, where the package has it built
    (as `FORK_LOOP_FILE`, which the zygote loads when it is there: `sandbox.guest._forkloop`)."""
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=_parent()))
    path.chmod(0o755)
    copies = [(GUEST_DIR / name, name) for name in (*GUEST_FILES, *ZYGOTE_FILES)]
    library = fork_loop_library() if native_fork_loop else None
    if library is not None:
        copies.append((library, FORK_LOOP_FILE))
    for source, name in copies:
        target = path / name
        shutil.copyfile(source, target)
        target.chmod(0o644)
    return path


def sweep_stale_runtime_dirs() -> int:
    """Kills the processes of dead servers' runtime dirs, removes the dirs; returns how many."""
    stale = []
    for entry in _parent().glob(f"{PREFIX}*"):
        match = _NAME.match(entry.name)
        if match and entry.is_dir() and not psutil.pid_exists(int(match.group(1))):
            stale.append(entry)
    if not stale:
        return 0
    marks = [str(path) for path in stale]
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if any(arg in marks for arg in cmdline):
            with contextlib.suppress(psutil.Error):
                proc.kill()
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return len(stale)
