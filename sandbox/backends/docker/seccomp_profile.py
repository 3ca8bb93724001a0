"""The seccomp profile every sandbox container runs under: an allow-list, with the process
backend's deny-list on top.

The engine's default profile is not enough: it differs between engines and versions (Debian's
Docker 20.10 allows `io_uring_setup`, which the process backend refuses), and we cannot review
what we do not ship. This module builds the profile from our own tables, in Docker's profile
format (`defaultAction`, `defaultErrnoRet`, `architectures`, `syscalls` with `names`, `action`,
`errnoRet`, `args`), and `spec` passes it to every container as `seccomp=<json>`.

Three rules, checked in this order by the kernel's filter:

- the process backend's `DENIED_SYSCALLS` (keyrings, BPF, perf, userfaultfd, io_uring, ptrace,
  module loading, the mount API, namespaces, file handles, host settings) fail with EPERM, as
  they do there, so a library that probes a feature falls back as it would without privileges;
- `ALLOWED_SYSCALLS`, what the interpreter, threads, subprocesses and asyncio use, run; `clone`
  only without namespace flags (the flags are its first argument, so the filter can see them);
- `clone3` fails with ENOSYS: its flags sit behind a pointer the filter cannot read, and glibc
  falls back to `clone` on ENOSYS (not on EPERM). Under gVisor (`profile(oci_runtime="runsc")`)
  it is allowed instead: runsc enforces the profile inside its own kernel and answers every
  refusal with EPERM whatever `errnoRet` says (Debian's runsc 20221219 does), so a refused
  `clone3` would leave a script without threads; allowed, it reaches gVisor's own `clone3`,
  which that version does not implement (ENOSYS, so glibc falls back to the filtered `clone`).
  The call never reaches the host kernel either way: the filter guards gVisor's syscall table;
- everything else fails with ENOSYS, as on a kernel without the call, where the engine honours
  `defaultErrnoRet`, and with EPERM where it does not (Docker 20.10 ignores it).

Only native 64-bit syscalls are listed: a 32-bit call (`int 0x80` on x86-64) matches no
architecture of the profile and is refused by the engine's runtime.
"""

from __future__ import annotations

import errno
import functools
import json
import os
from typing import Any

from sandbox.backends.process.seccomp import DENIED_SYSCALLS

__all__ = ["ALLOWED_SYSCALLS", "CLONE_NAMESPACE_FLAGS", "DENIED_SYSCALLS", "profile_json"]

ALLOWED_SYSCALLS: tuple[str, ...] = (
    # files and descriptors
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2",
    "pwritev2", "lseek", "open", "openat", "openat2", "creat", "close", "close_range", "dup",
    "dup2", "dup3", "pipe", "pipe2", "fcntl", "flock", "ioctl", "stat", "fstat", "lstat",
    "newfstatat", "statx", "statfs", "fstatfs", "access", "faccessat", "faccessat2", "getdents",
    "getdents64", "getcwd", "chdir", "fchdir", "mkdir", "mkdirat", "rmdir", "rename",
    "renameat", "renameat2", "link", "linkat", "symlink", "symlinkat", "unlink", "unlinkat",
    "readlink", "readlinkat", "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown",
    "lchown", "fchownat", "umask", "truncate", "ftruncate", "fallocate", "fadvise64",
    "readahead", "fsync", "fdatasync", "sync", "syncfs", "sync_file_range", "utime", "utimes",
    "utimensat", "futimesat", "mknod", "mknodat", "sendfile", "splice", "tee", "vmsplice",
    "copy_file_range", "setxattr", "lsetxattr", "fsetxattr", "getxattr", "lgetxattr",
    "fgetxattr", "listxattr", "llistxattr", "flistxattr", "removexattr", "lremovexattr",
    "fremovexattr", "memfd_create", "inotify_init", "inotify_init1", "inotify_add_watch",
    "inotify_rm_watch", "cachestat",
    # waiting for descriptors, events and timers
    "poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1", "epoll_ctl",
    "epoll_wait", "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2", "signalfd", "signalfd4",
    "timerfd_create", "timerfd_settime", "timerfd_gettime", "io_setup", "io_destroy",
    "io_submit", "io_cancel", "io_getevents", "io_pgetevents",
    # memory
    "brk", "mmap", "munmap", "mprotect", "mremap", "msync", "mincore", "madvise", "mlock",
    "mlock2", "munlock", "mlockall", "munlockall", "remap_file_pages", "membarrier",
    "pkey_alloc", "pkey_free", "pkey_mprotect", "mseal", "map_shadow_stack",
    # processes and threads (`clone` is allowed below, without namespace flags)
    "fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid", "kill",
    "tkill", "tgkill", "getpid", "getppid", "gettid", "getpgid", "setpgid", "getpgrp",
    "getsid", "setsid", "set_tid_address", "set_robust_list", "get_robust_list", "rseq",
    "futex", "futex_waitv", "arch_prctl", "prctl", "seccomp", "pidfd_open", "pidfd_send_signal",
    "getrlimit", "setrlimit", "prlimit64", "getrusage", "getpriority", "setpriority",
    "sched_yield", "sched_getaffinity", "sched_setaffinity", "sched_getparam",
    "sched_setparam", "sched_getscheduler", "sched_setscheduler", "sched_get_priority_max",
    "sched_get_priority_min", "sched_rr_get_interval", "sched_getattr", "sched_setattr",
    "getcpu", "ioprio_get", "ioprio_set",
    # identity (changes only within the ids a process already has: it has no capabilities)
    "getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups", "setuid",
    "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups", "setfsuid",
    "setfsgid", "capget", "capset",
    # signals
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigtimedwait",
    "rt_sigqueueinfo", "rt_tgsigqueueinfo", "rt_sigsuspend", "sigaltstack", "pause", "alarm",
    "getitimer", "setitimer", "restart_syscall",
    # time and the system
    "clock_gettime", "clock_getres", "clock_nanosleep", "nanosleep", "gettimeofday", "time",
    "times", "timer_create", "timer_settime", "timer_gettime", "timer_getoverrun",
    "timer_delete", "uname", "sysinfo", "getrandom",
    # sockets (the container has no network; the tool channel is a Unix socket)
    "socket", "socketpair", "bind", "listen", "accept", "accept4", "connect", "getsockname",
    "getpeername", "sendto", "recvfrom", "sendmsg", "recvmsg", "sendmmsg", "recvmmsg",
    "shutdown", "setsockopt", "getsockopt",
    # System V and POSIX IPC, private to the container's IPC namespace
    "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl", "msgget",
    "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive",
    "mq_notify", "mq_getsetattr",
    # unprivileged self-restriction
    "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self",
)  # fmt: skip

# clone(2) flags that create namespaces; `clone` is allowed only with none of them set.
CLONE_NAMESPACE_FLAGS = (
    0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
)
# Every 64-bit architecture an engine of ours may run on; a profile names syscalls per
# architecture, and the runtime skips a name an architecture does not have.
ARCHITECTURES = ("SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64")


def profile(oci_runtime: str = "runc") -> dict[str, Any]:
    """The profile as Docker reads it, for the engine's OCI runtime (see the module docstring
    for the one difference under gVisor)."""
    denied = set(DENIED_SYSCALLS)
    overlap = denied & set(ALLOWED_SYSCALLS)
    if overlap:  # a programming error: the deny-list must win
        raise ValueError(f"syscalls both allowed and denied: {sorted(overlap)}")
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": errno.ENOSYS,
        "architectures": list(ARCHITECTURES),
        "syscalls": [
            {"names": list(DENIED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM},
            {"names": list(ALLOWED_SYSCALLS), "action": "SCMP_ACT_ALLOW"},
            # Named, not left to the default: an engine that ignores `defaultErrnoRet` (Debian's
            # 20.10 does) answers EPERM, on which glibc does not fall back to `clone`.
            (
                {"names": ["clone3"], "action": "SCMP_ACT_ALLOW"}
                if oci_runtime == "runsc"
                else {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS}
            ),
            {
                "names": ["clone"],
                "action": "SCMP_ACT_ALLOW",
                "args": [
                    {
                        "index": 0,
                        "value": CLONE_NAMESPACE_FLAGS,
                        "valueTwo": 0,
                        "op": "SCMP_CMP_MASKED_EQ",
                    }
                ],
            },
            # personality(2): reading it (0xffffffff), or setting the plain Linux one (0)
            *(
                {
                    "names": ["personality"],
                    "action": "SCMP_ACT_ALLOW",
                    "args": [{"index": 0, "value": value, "op": "SCMP_CMP_EQ"}],
                }
                for value in (0x0, 0xFFFFFFFF)
            ),
        ],
    }


@functools.cache
def profile_json(oci_runtime: str = "runc") -> str:
    """The profile as the `seccomp=` security option carries it (compact, stable)."""
    return json.dumps(profile(oci_runtime), separators=(",", ":"))


if __name__ == "__main__":  # `python -m sandbox.backends.docker.seccomp_profile > profile.json`
    os.write(1, (json.dumps(profile(), indent=2) + "\n").encode())
