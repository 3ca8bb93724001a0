"""The syscall filter of a process sandbox: the kernel's rarely needed, often exploited
interfaces answer EPERM.

Namespaces and an empty capability set keep a script away from the host's objects; they do not
shrink the kernel code it can reach, and a kernel bug is what a sandbox escape needs. The
interfaces below (keyrings, BPF, perf events, userfaultfd, io_uring, ptrace, module and kexec
loading, the mount API, namespace entry, file handles, clock and host settings) are where many
such bugs were found, and no script of ours needs them. It is a deny-list, not Docker's
allow-list: an allow-list must track every syscall the interpreter and its libraries may use on
every kernel, and a miss breaks scripts in ways that are hard to diagnose; thread creation
(`clone3`) in particular stays allowed. Denied calls fail with EPERM rather than killing, so a
library that probes a feature falls back as it would without privileges.

The program is compiled once per server with libseccomp, through `pyseccomp` (a ctypes binding
with the official bindings' API; those are built for Debian's own Python only), and handed to
bubblewrap as BPF on a memfd (`--seccomp FD`), which installs it just before the guest starts:
every process of the sandbox runs under it, with no_new_privs set.
"""

from __future__ import annotations

import errno
import functools
import os

__all__ = ["DENIED_SYSCALLS", "filter_program", "program_fd", "unavailable_reason"]

DENIED_SYSCALLS = (
    # kernel keyrings
    "add_key", "keyctl", "request_key",
    # BPF, perf events, userfaultfd, io_uring
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register",
    # other processes' memory
    "ptrace", "process_vm_readv", "process_vm_writev",
    # kernel modules and kexec
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    # the mount API and namespaces
    "mount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount",
    "open_tree", "mount_setattr", "unshare", "setns",
    # file handles (open_by_handle_at reads files by inode, past the mount namespace)
    "open_by_handle_at", "name_to_handle_at",
    # the host's clock, devices, accounting and identity
    "reboot", "swapon", "swapoff", "acct", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex", "syslog", "vhangup", "quotactl", "quotactl_fd", "lookup_dcookie", "nfsservctl",
    "uselib", "iopl", "ioperm", "sethostname", "setdomainname", "fanotify_init",
)  # fmt: skip


@functools.cache
def filter_program() -> bytes:
    """The compiled BPF program; raises OSError when libseccomp cannot be loaded."""
    import pyseccomp  # loads libseccomp.so.2 with ctypes: an OSError when it is missing

    rules = pyseccomp.SyscallFilter(defaction=pyseccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        rules.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
    fd = os.memfd_create("ptc-seccomp", os.MFD_CLOEXEC)
    try:
        with os.fdopen(os.dup(fd), "wb") as out:
            rules.export_bpf(out)
        size = os.lseek(fd, 0, os.SEEK_END)
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


def unavailable_reason() -> str | None:
    """Why no filter can be built here, or None."""
    try:
        filter_program()
    except (OSError, RuntimeError, ValueError) as exc:
        return f"cannot build the seccomp filter (libseccomp2 missing?): {exc}"
    return None


def program_fd() -> int:
    """A fresh memfd holding the program, at offset 0, for one bwrap to read (inheritable only
    through `pass_fds`); the caller closes it once bwrap has started."""
    fd = os.memfd_create("ptc-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, filter_program())
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
