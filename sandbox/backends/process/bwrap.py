"""The bubblewrap command line of one process sandbox, and the host checks it depends on.

bubblewrap is Debian's small, audited namespace launcher (the one Flatpak uses). We use it
rather than calling unshare(2)/mount(2) ourselves because it sets up the user, pid, network,
ipc, uts, mount and cgroup namespaces, a minimal /dev and /proc, a fresh root made only of the
mounts we name, and drops every capability, in one exec, with years of hardening behind it.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ZygoteOptions", "as_user_prefix", "bwrap_path", "probe_bwrap", "zygote_argv"]

# Layers every process sandbox has when bwrap starts at all.
NAMESPACE_LAYERS = [
    "userns",
    "pidns",
    "netns:empty",
    "ipcns",
    "utsns",
    "mntns",
    "cgroupns",
    "no_nested_userns",
    "caps:none",
    "fs:readonly-runtime",
    "env:clear",
    "stdin:empty",
]


@dataclass(frozen=True)
class ZygoteOptions:
    python: str  # the guest interpreter, by its real path
    runtime_dir: Path  # holds the guest files; mounted read-only at /ptc
    uid: int  # uid and gid inside the sandbox (the host uid is the caller's)
    gid: int
    control_fd: int  # the zygote's end of the fork-request socket
    program_fd: int  # the compiled seccomp program (empty: none), read once by the zygote
    # A runtime's tree (`sandbox.runtimes`), mounted read-only at /ptc-runtime; None: stdlib only.
    runtime_tree: Path | None = None
    preload: tuple[str, ...] = ()  # modules the zygote imports once, before forking
    # One uid per sandbox (`uid_range`): bwrap reports its child's pid on ``info_fd`` and waits
    # on ``userns_block_fd`` while the host maps the range in the new user namespace; -1: bwrap
    # maps the zygote's one uid itself.
    userns_block_fd: int = -1
    info_fd: int = -1


@functools.cache
def bwrap_path() -> str | None:
    return shutil.which("bwrap")


@functools.cache
def _setpriv_path() -> str | None:
    return shutil.which("setpriv")


def as_user_prefix(uid: int, gid: int) -> list[str]:
    """What runs bwrap as ``uid``:``gid`` with no supplementary groups when the host is root
    (util-linux's ``setpriv``, which execs it); nothing otherwise.

    Not `subprocess`'s ``user=``/``group=``: with those Python starts the child with fork(2)
    instead of vfork(2), and fork(2) runs the host process's fork handlers in the child. gRPC's
    restarts its poller thread there, `subprocess` closes the poller's epoll before the exec,
    and gRPC aborts the child (grpc/grpc#43055): a served fork server then "did not start".
    vfork(2) runs no fork handlers, whatever library the host has loaded."""
    if os.getuid() != 0:
        return []
    setpriv = _setpriv_path()
    if setpriv is None:
        raise FileNotFoundError(
            "setpriv (Debian package util-linux) is not installed: as root the host needs it "
            "to start bwrap as the sandbox user"
        )
    return [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]


def _python_mounts(python: str) -> list[str]:
    """The interpreter must be visible inside; /usr is always mounted."""
    prefix = Path(python).resolve().parent.parent
    if prefix == Path("/usr") or Path("/usr") in prefix.parents:
        return []
    return ["--ro-bind", str(prefix), str(prefix)]


def zygote_argv(options: ZygoteOptions) -> list[str]:
    """The fork server's command line: the sandbox's read-only view of the runtime, its own
    user, network, ipc, uts and cgroup namespaces, and every capability inside its user
    namespace only, which its children use to build their own namespaces and then drop
    (`sandbox.guest._confine`). No pid namespace of its own: its children must outlive it."""
    bwrap = bwrap_path()
    if bwrap is None:
        raise FileNotFoundError("bwrap (Debian package bubblewrap) is not installed")
    return [
        bwrap,
        "--unshare-user",
        *_userns_block_args(options),
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--uid", str(options.uid),
        "--gid", str(options.gid),
        "--cap-add", "ALL",
        "--hostname", "sandbox",
        # No --die-with-parent: a parent-death signal would kill the zygote before it kills its
        # sandboxes. It sees the host's end at its control socket and kills them, then exits.
        "--new-session",
        "--clearenv",
        "--setenv", "PATH", "/usr/bin:/bin",
        "--setenv", "HOME", "/tmp",
        "--setenv", "LANG", "C.UTF-8",
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/lib", "/lib",
        "--symlink", "usr/lib64", "/lib64",
        "--symlink", "usr/bin", "/bin",
        "--symlink", "usr/sbin", "/sbin",
        *_python_mounts(options.python),
        "--ro-bind", str(options.runtime_dir), "/ptc",
        *_runtime_mounts(options),
        "--proc", "/proc",
        "--dev", "/dev",
        # Mount points for each child's private tmpfs; the zygote itself writes nowhere.
        "--dir", "/tmp",
        "--dir", "/dev/shm",
        "--remount-ro", "/dev",
        "--chdir", "/tmp",  # PWD=/tmp in the environment every child inherits
        "--remount-ro", "/",
        "--",
        options.python, "-I", "-S", "-B", "-X", "utf8",
        "/ptc/zygote.py", str(options.control_fd), str(options.program_fd),
        *_runtime_args(options),
    ]  # fmt: skip


RUNTIME_MOUNT = "/ptc-runtime"


def _userns_block_args(options: ZygoteOptions) -> list[str]:
    if options.userns_block_fd < 0:
        return []
    return [
        "--userns-block-fd", str(options.userns_block_fd), "--info-fd", str(options.info_fd),
    ]  # fmt: skip


def _runtime_mounts(options: ZygoteOptions) -> list[str]:
    if options.runtime_tree is None:
        return []
    return ["--ro-bind", str(options.runtime_tree), RUNTIME_MOUNT]


def _runtime_args(options: ZygoteOptions) -> list[str]:
    """The zygote's optional SITE and PRELOAD arguments: the runtime's packages (added to the
    guest's sys.path explicitly: it still starts with -I -S) and what to import before forking."""
    if options.runtime_tree is None:
        return []
    return [f"{RUNTIME_MOUNT}/site", ",".join(options.preload)]


@functools.cache
def probe_bwrap(python: str, uid: int, gid: int) -> str | None:
    """Starts one trivial sandbox; returns None when it works, else the reason it does not."""
    bwrap = bwrap_path()
    if bwrap is None:
        return "bwrap is not installed (Debian package bubblewrap)"
    if not os.access(python, os.X_OK):
        return f"the guest interpreter {python} is not executable"
    argv = [
        bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
        "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib",
        "--symlink", "usr/lib64", "/lib64", *_python_mounts(python),
        "--proc", "/proc", "--dev", "/dev", "--", python, "-I", "-S", "-c", "pass",
    ]  # fmt: skip
    try:
        argv = [*as_user_prefix(uid, gid), *argv]
        proc = subprocess.run(argv, capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap failed to start: {exc}"
    if proc.returncode != 0:
        message = proc.stderr.decode(errors="replace").strip()
        how = (
            f"killed by signal {-proc.returncode}"
            if proc.returncode < 0
            else f"exit status {proc.returncode}"
        )
        return f"bwrap cannot create namespaces here ({how}): {message or 'no message'}"
    return None
