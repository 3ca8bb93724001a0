"""The kernel calls that confine one forked sandbox, through ctypes (standard library only).

Runs inside the zygote's bubblewrap, in the children the zygote forks, before any untrusted
byte: new namespaces, private mounts, the loopback device, dropping every capability,
no_new_privs and the seccomp filter. Python 3.11 has no `os.unshare` or `mount`, and bubblewrap
cannot be re-entered for each child without paying an interpreter start, which is what the fork
server exists to avoid; so these few syscalls are called here, each checked, each failure an
`OSError` that ends the child before it says ready.

The zygote holds every capability inside its own user namespace (bwrap `--cap-add ALL`, never on
the host); a child uses them to build its namespaces and mounts and then drops all of them, the
bounding and ambient sets included, before the script runs.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import socket
import struct
import threading

__all__ = [
    "CloneIntoPidNamespace",
    "SeccompFilter",
    "become_sandbox_user",
    "drop_capabilities",
    "empty_bounding_set",
    "forbid_user_namespaces",
    "last_capability",
    "make_device_nodes_readonly",
    "mount_proc",
    "mount_tmpfs",
    "own_mount_namespace",
    "set_death_signal",
    "unshare_sandbox_namespaces",
    "up_loopback",
    "volunteer_for_oom_kill",
]

_libc = ctypes.CDLL(None, use_errno=True)
# Calls through this one keep the GIL, as os.fork does around fork(2).
_api = ctypes.PyDLL(None, use_errno=True)

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_CHILD_CLEARTID = 0x00200000
CLONE_CHILD_SETTID = 0x01000000
SYS_CLONE3 = 435  # the same number on every architecture

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_RELATIME = 1 << 21
_ST_RELATIME = 4096  # statvfs's bit for relatime differs from mount(2)'s
DEVICE_NODES = ("null", "zero", "full", "random", "urandom", "tty")

_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
_libc.prctl.argtypes = [
    ctypes.c_int,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _prctl(option: int, arg2: int = 0, arg3: int = 0) -> None:
    _check(_libc.prctl(option, arg2, arg3, 0, 0), f"prctl({option})")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def own_mount_namespace() -> None:
    """The zygote's own mount namespace, owned by its user namespace.

    bwrap leaves the zygote in a mount namespace that its user namespace does not own, where
    no mount can be changed; a copy owned by it can (the copied mounts stay locked against
    being taken apart, as the kernel does for any less privileged copy)."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare(mount)")
    _mount("none", "/", None, MS_REC | MS_PRIVATE, None)


def forbid_user_namespaces() -> None:
    """No process below this user namespace may create another one (the zygote, once).

    The limit is the zygote's namespace's own `user.max_user_namespaces`; a child's creation
    counts against every ancestor's limit, so 0 here refuses `clone(CLONE_NEWUSER)` and
    `clone3` alike, which a seccomp filter on `unshare` alone would not."""
    with open("/proc/sys/user/max_user_namespaces", "w") as limit:
        limit.write("0")


def _kept_flags(path: str) -> int:
    have = os.statvfs(path).f_flag
    same = MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME  # equal bit values
    return (have & same) | (MS_RELATIME if have & _ST_RELATIME else 0)


def make_device_nodes_readonly() -> None:
    """bwrap's `/dev` nodes are bind mounts of the host's inodes: read-only mounts, so that no
    sandbox can chmod, chown or touch the host's `/dev/null` (writing to the device still works:
    a read-only mount does not stop I/O on a device node)."""
    for node in DEVICE_NODES:
        path = f"/dev/{node}"
        if os.path.exists(path):
            # A remount must keep the flags the host's mount locked (atime, nosuid, ...).
            _mount("none", path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _kept_flags(path), None)


def unshare_sandbox_namespaces(pid: bool = True) -> None:
    """Mount, network, ipc, uts and cgroup namespaces of our own, and unless we were born in
    one, a pid namespace for the next child."""
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP
    _check(_libc.unshare(flags | (CLONE_NEWPID if pid else 0)), "unshare")
    # Nothing mounted from here on may reach the zygote's or a sibling's mount namespace.
    _mount("none", "/", None, MS_REC | MS_PRIVATE, None)
    socket.sethostname("sandbox")


def volunteer_for_oom_kill() -> None:
    """The kernel's first choice when memory runs out, for this process and all it forks.

    Where a sandbox has no memory cgroup of its own (the degraded process backend, e.g. the
    Kubernetes base), its processes share the server's cgroup, and when that cgroup's limit is
    reached the OOM killer takes the largest process, which could be the server. At 1000 every
    sandbox process is taken before any process of the server. Raising one's own score needs
    no privilege.
    """
    # os.open and bytes, not open(): a text file in the child imported the ascii codec and
    # built an io stack after the fork, half a MiB of copied pages in every idle sandbox.
    fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
    try:
        os.write(fd, b"1000")
    finally:
        os.close(fd)


def mount_tmpfs(target: str, size_bytes: int) -> None:
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size_bytes},mode=1777")


def mount_proc() -> None:
    """A /proc of the new pid namespace over the zygote's (pid 1 of that namespace calls it)."""
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)


def up_loopback() -> None:
    """The new network namespace's `lo`, up (bwrap did the same): no other device exists."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def become_sandbox_user(uid: int) -> None:
    """Pid 1 of a sandbox takes the uid (and a gid of the same number) the host gave its slot,
    while it still holds its capabilities, before anything of the script runs: the kernel
    counts RLIMIT_NPROC per uid, so with a uid of its own it counts this sandbox's processes and
    threads alone (the host maps the range in the zygote's user namespace, `uid_range`).

    The change of credentials makes the process non-dumpable; made dumpable again so that the
    sandbox sees its own /proc as a sandbox that kept the zygote's uid did (any ptrace is still
    the seccomp filter's to refuse)."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid):
        raise OSError(f"the sandbox did not become uid {uid}: {os.getresuid()}")
    _prctl(PR_SET_DUMPABLE, 1)


def set_death_signal(signum: int) -> None:
    _prctl(PR_SET_PDEATHSIG, signum)


def become_subreaper() -> None:
    """Orphaned descendants (a sandbox whose first child exited) become our children."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def last_capability() -> int:
    """The highest capability number this kernel knows (read once, in the zygote)."""
    with open("/proc/sys/kernel/cap_last_cap") as last:
        return int(last.read())


def empty_bounding_set(last_cap: int) -> None:
    """No process forked from here on can ever gain a capability through exec (the zygote, once:
    the bounding set limits only what exec grants, so the zygote keeps its own)."""
    for cap in range(last_cap + 1):
        _prctl(PR_CAPBSET_DROP, cap)


class _SeccompProgram(ctypes.Structure):
    """`struct sock_fprog`."""

    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


# capset(2)'s arguments for "no capabilities at all", made once in the zygote: a child touches
# as little of the inherited heap as it can (every page it writes to is copied on write).
_CAP_HEADER = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
_CAP_NONE = (ctypes.c_uint32 * 6)()  # two all-zero __user_cap_data_struct


def drop_capabilities() -> None:
    """Empties the ambient, inheritable, permitted and effective sets (the bounding set is
    already empty: `empty_bounding_set`)."""
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    _check(_libc.capset(_CAP_HEADER, _CAP_NONE), "capset")


class SeccompFilter:
    """A BPF program (an array of `struct sock_filter`, as libseccomp exports it), laid out for
    the kernel once (in the zygote), installed by each child with one call."""

    def __init__(self, program: bytes) -> None:
        if len(program) % 8:
            raise OSError(0, "seccomp: the program is not a whole number of instructions")
        self.empty = not program
        self._buffer = ctypes.create_string_buffer(program, len(program))
        self._program = _SeccompProgram(len(program) // 8, ctypes.addressof(self._buffer))
        self._address = ctypes.addressof(self._program)

    def install(self) -> None:
        """no_new_privs, then the filter, for this process and everything it starts."""
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        if self.empty:
            return
        _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, self._address, 0, 0), "seccomp")


class _CloneArgs(ctypes.Structure):
    """`struct clone_args` as of Linux 5.3 (CLONE_ARGS_SIZE_VER0, 64 bytes)."""

    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size",
            "tls",
        )
    ]  # fmt: skip


class CloneIntoPidNamespace:
    """A fork whose child is pid 1 of a new pid namespace: one fork per sandbox instead of a
    fork that unshares and forks again (a fork of the zygote costs about 1.7 ms of CPU, most of
    it copying and tearing down its page tables).

    Python has no clone(2), so this is clone3 with no new stack (fork semantics) through
    ctypes, wrapped exactly as `os.fork` wraps fork(2): PyOS_BeforeFork, the call with the GIL
    held, PyOS_AfterFork_Child / _Parent. What glibc's fork does besides, setting the thread id
    it keeps in the thread control block, is CLONE_CHILD_SETTID with that field's address,
    which glibc does not publish. `probe` searches the calling thread's control block for words
    that hold its tid and proves each candidate in a test child until one holds: the child
    locks a mutex, which makes glibc write the tid it keeps into the mutex's owner, and that
    must be the child's own (1). A search alone can find more than one word: the tid is only
    a number, and in a small pid namespace (a container) it is a small one, which other fields
    of the block (key sequence numbers, flags) hold too. No candidate proved (another libc, a
    seccomp filter without clone3) leaves `available` False and the zygote forks twice, as
    before: slower to start a sandbox, the same isolation.
    """

    _CONTROL_BLOCK_BYTES = 1024  # where glibc keeps the tid (offset 720 on x86_64, 2.36)
    _MUTEX_BYTES = 64  # at least sizeof(pthread_mutex_t); all zero is PTHREAD_MUTEX_INITIALIZER
    _MUTEX_OWNER_OFFSET = 8  # int __lock; unsigned __count; int __owner (every glibc ABI)

    def __init__(self) -> None:
        self.available = False
        self.why_not = ""
        self._tid_address = 0
        _api.syscall.restype = ctypes.c_long
        _api.syscall.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_size_t]
        _api.PyOS_BeforeFork.restype = None
        _api.PyOS_AfterFork_Parent.restype = None
        _api.PyOS_AfterFork_Child.restype = None

    def probe(self) -> None:
        """Find the tid field and prove it in a child; the caller must not ignore SIGCHLD yet."""
        pthread_self = _libc.pthread_self
        pthread_self.restype = ctypes.c_void_p
        block = pthread_self()
        if not block:
            self.why_not = "no thread control block"
            return
        raw = ctypes.string_at(block, self._CONTROL_BLOCK_BYTES)
        needle = struct.pack("=i", threading.get_native_id())
        offsets = [i for i in range(0, len(raw) - 3, 4) if raw[i : i + 4] == needle]
        if not offsets:
            self.why_not = "the thread id is nowhere in the thread control block"
            return
        for offset in offsets:
            self._tid_address = block + offset
            try:
                self.available = self._proved()
            except OSError as exc:
                self.why_not = f"clone3: {exc.strerror}"
                return
            if self.available:
                return
        self._tid_address = 0
        self.why_not = (
            f"none of the {len(offsets)} words of the thread control block that hold the "
            "thread id is the one the C library uses"
        )

    def _proved(self) -> bool:
        """Whether a child cloned with the candidate address finds its own tid where the C
        library reads it (a locked mutex's owner), not the zygote's."""
        pid = self._clone()
        if pid == 0:
            ok = False
            try:
                mutex = ctypes.create_string_buffer(self._MUTEX_BYTES)
                if _libc.pthread_mutex_lock(mutex) == 0:
                    (owner,) = struct.unpack_from("=i", mutex.raw, self._MUTEX_OWNER_OFFSET)
                    _libc.pthread_mutex_unlock(mutex)
                    ok = owner == threading.get_native_id() == os.getpid() == 1
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status) == 0

    def fork(self) -> int:
        """0 in the child (pid 1 of its new pid namespace), the child's pid in the parent."""
        return self._clone()

    @property
    def clone_flags(self) -> int:
        """What `fork` passes to clone3; the zygote's C loop is given the same."""
        return CLONE_NEWPID | CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID

    @property
    def tid_address(self) -> int:
        """The proved address of the thread id in the thread control block (0: none)."""
        return self._tid_address

    def _clone(self) -> int:
        args = _CloneArgs(self.clone_flags, 0, self._tid_address, 0, signal.SIGCHLD, 0, 0, 0)
        _api.PyOS_BeforeFork()
        pid = _api.syscall(SYS_CLONE3, ctypes.byref(args), ctypes.sizeof(args))
        if pid == 0:
            _api.PyOS_AfterFork_Child()
            return 0
        err = ctypes.get_errno()
        _api.PyOS_AfterFork_Parent()
        if pid < 0:
            raise OSError(err, f"clone3: {os.strerror(err)}")
        return int(pid)
