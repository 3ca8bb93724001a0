"""One uid per sandbox: the range of uids the process backend gives its sandboxes, the map that
makes them exist in the zygote's user namespace, and the pool that hands them out.

Why: the kernel counts RLIMIT_NPROC per uid. With every sandbox under one uid, one tenant's fork
bomb used up the count of all of them, and `fork` and thread starts failed in every other
tenant's sandbox; where no cgroup bounds a sandbox's processes (the degraded mode, a Kubernetes
pod whose cgroups are read-only) that limit is the only one. With a uid of its own, a sandbox's
RLIMIT_NPROC counts that sandbox alone.

How, and why this way. Every sandbox is forked by one zygote, and a child inherits its parent's
uid, so a uid switch by the host before exec (setpriv's) can only give all of them one; the uids
must exist inside the zygote's user namespace, and each sandbox must switch to its own there.
bwrap still creates that namespace (`bwrap.zygote_argv`), but with ``--userns-block-fd``: it
stops right after creating it and reports its child's pid on ``--info-fd``; the host, root in
its own user namespace (root on a host, or in a pod that has a user namespace with a mapped
range), has a `uid_map` and `gid_map` of two lines written, the zygote's own uid and the range,
each mapped to itself, and lets bwrap go on (`map_zygote_namespace`). Writing a map of more than
the writer's own uid needs CAP_SETUID and CAP_SETGID in the parent namespace: the host has them
as root, an unprivileged server does not, and there `find_range` says why and every sandbox
keeps the one uid (the result's isolation says ``limit:processes=rlimit-shared``). The writer is
a short helper that runs as the zygote's uid, the namespace's owner, with CAP_SETUID and
CAP_SETGID alone (setpriv's ambient capabilities), as newuidmap would: the map files belong to
that uid, and root opens them only with CAP_DAC_OVERRIDE, which the Kubernetes base does not
grant (its root has SYS_ADMIN, SETUID, SETGID and KILL). Not newuidmap itself: it reads the
ranges an account may map from /etc/subuid, which a container image does not have.
The host picks the slot's uid and tells the child with its go-ahead on the channel (nothing
untrusted runs in the sandbox yet); the sandbox's pid 1 switches to it while it still holds its
capabilities in the zygote's namespace, after its mounts and before it drops every capability
(`sandbox.guest._confine.become_sandbox_user`). The zygote never chooses a uid.

Reuse: a uid is never given to two live sandboxes, and goes back to the pool only once the host
has read pid 1's exit status. That is sound because the kernel reaps every other process of a
pid namespace before its init's exit is reported (the init's exit waits in
`zap_pid_ns_processes` until the namespace holds no other pid), and the status is readable only
once pid 1 itself is reaped; RLIMIT_NPROC's count drops at each reap. A uid whose sandbox's end
the host did not see (a start that failed after the fork, an exit status never read) is held in
quarantine, and comes back only when no process in /proc has it (looked at when no free uid is
left). Free uids are handed out oldest first, so a uid is reused as late as the range allows.
Other backends of the same host give from the same range: a uid is taken only with a claim no
other backend holds (`uid_claims`).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import select
import shutil
import subprocess
import time
from dataclasses import dataclass

from sandbox.backends.process.uid_claims import UidClaims
from sandbox.errors import Unavailable

__all__ = [
    "DEFAULT_COUNT",
    "DEFAULT_FIRST",
    "UidPool",
    "UidRange",
    "UsernsGate",
    "find_range",
    "map_zygote_namespace",
    "uid_in_use",
]

# 57344-61439: below nobody (65534), inside the 65536 ids of a pod's user namespace, above the
# ids distributions give accounts by default (1000-59999 is Debian's; `find_range` refuses a
# range holding an account of /etc/passwd or a group of /etc/group).
DEFAULT_FIRST = 57344
DEFAULT_COUNT = 4096
INFO_MAX_BYTES = 4096
# The helper that writes the maps: PID UID_MAP GID_MAP, each map in one write(2) (the kernel
# takes no second one).
_WRITE_MAPS = """
import os, sys
for kind, text in (("uid", sys.argv[2]), ("gid", sys.argv[3])):
    fd = os.open(f"/proc/{sys.argv[1]}/{kind}_map", os.O_WRONLY | os.O_CLOEXEC)
    os.write(fd, text.encode())
    os.close(fd)
"""


@dataclass(frozen=True)
class UidRange:
    """Ids ``first`` to ``first + count - 1``, used as both uid and gid."""

    first: int
    count: int

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.first <= uid < self.first + self.count

    def map_line(self) -> str:
        return f"{self.first} {self.first} {self.count}\n"


def _mapped(path: str, first: int, count: int) -> bool:
    """Whether every id of the range is mapped in this process's namespace (``path``: its
    uid_map or gid_map, lines of INSIDE OUTSIDE LENGTH)."""
    with open(path) as lines:
        extents = sorted(
            (int(inside), int(length))
            for inside, _outside, length in (line.split() for line in lines if line.strip())
        )
    want = first
    for inside, length in extents:
        if inside <= want < inside + length:
            want = inside + length
        if want >= first + count:
            return True
    return False


def _accounts_in(path: str, wanted: UidRange) -> list[str]:
    """Names in /etc/passwd or /etc/group (``path``) whose id is in the range."""
    try:
        with open(path) as lines:
            fields = [line.split(":") for line in lines if line.count(":") >= 3]
    except FileNotFoundError:
        return []
    return [f"{row[0]} ({row[2]})" for row in fields if row[2].isdigit() and int(row[2]) in wanted]


def find_range(first: int, count: int, zygote_uid: int, zygote_gid: int) -> UidRange | str:
    """The range to give sandboxes, or why this host cannot give one (every sandbox then runs
    as the zygote's uid)."""
    if count <= 0:
        return "one uid per sandbox is turned off in the backend's configuration"
    wanted = UidRange(first, count)
    if os.geteuid() != 0:
        return (
            f"the server runs as uid {os.geteuid()}, not root in its user namespace: it cannot "
            "map a range of uids for its sandboxes"
        )
    if first <= 0 or zygote_uid in wanted or zygote_gid in wanted:
        return (
            f"the sandbox uid range {first}-{first + count - 1} must leave out root and the "
            f"zygote's uid {zygote_uid} and gid {zygote_gid}"
        )
    for kind in ("uid", "gid"):
        if not _mapped(f"/proc/self/{kind}_map", first, count):
            return (
                f"{kind}s {first}-{first + count - 1} are not all mapped in the server's user "
                f"namespace (/proc/self/{kind}_map)"
            )
    taken = _accounts_in("/etc/passwd", wanted) + _accounts_in("/etc/group", wanted)
    if taken:
        return f"the sandbox uid range {first}-{first + count - 1} holds accounts: {taken[:5]}"
    return wanted


def map_zygote_namespace(
    info_fd: int,
    block_fd: int,
    zygote_uid: int,
    zygote_gid: int,
    uids: UidRange,
    python: str,
    timeout_s: float,
) -> None:
    """Maps the zygote's own uid and gid and the range in the user namespace bwrap has just
    created (its child's pid read from ``info_fd``), then lets bwrap go on (``block_fd``).
    ``python`` runs the helper that writes the maps: the guest's interpreter, which the zygote's
    uid can execute (the server's own may live where only root can read). Raises OSError or
    ValueError when it cannot."""
    deadline = time.monotonic() + timeout_s
    report = b""
    while not report.rstrip().endswith(b"}"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([info_fd], [], [], left)[0]:
            raise TimeoutError(f"bwrap reported no user namespace in {timeout_s} s")
        chunk = os.read(info_fd, INFO_MAX_BYTES)
        if not chunk or len(report) > INFO_MAX_BYTES:
            raise ValueError(f"bwrap's report of its namespaces ended early: {report[:200]!r}")
        report += chunk
    pid = json.loads(report).get("child-pid")
    if not isinstance(pid, int) or pid <= 0:
        raise ValueError(f"bwrap reported no child pid: {report[:200]!r}")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise FileNotFoundError("setpriv (Debian package util-linux) is not installed")
    writer = [
        setpriv, f"--reuid={zygote_uid}", f"--regid={zygote_gid}", "--clear-groups",
        "--inh-caps=-all,+setuid,+setgid", "--ambient-caps=-all,+setuid,+setgid", "--",
        python, "-I", "-S", "-c", _WRITE_MAPS, str(pid),
        f"{zygote_uid} {zygote_uid} 1\n{uids.map_line()}",
        f"{zygote_gid} {zygote_gid} 1\n{uids.map_line()}",
    ]  # fmt: skip
    try:
        wrote = subprocess.run(
            writer,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=max(1.0, deadline - time.monotonic()),
            check=False,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        )
    except subprocess.TimeoutExpired as exc:
        raise TimeoutError(f"the uid map writer did not finish: {exc}") from exc
    if wrote.returncode != 0:
        said = wrote.stderr.decode(errors="replace").strip()[-500:]
        raise OSError(f"the uid map of the zygote's user namespace was not written: {said}")
    os.write(block_fd, b"m")


class UsernsGate:
    """The two pipes between the host and bwrap while the host maps the zygote's user namespace
    (none without a range): bwrap's report of its child's pid, and the host's go-ahead."""

    def __init__(self, uids: UidRange | None) -> None:
        self.uids = uids
        self.info_r, self.info_w = os.pipe() if uids is not None else (-1, -1)
        self.block_r, self.block_w = os.pipe() if uids is not None else (-1, -1)

    def bwrap_fds(self) -> tuple[int, ...]:
        """bwrap's ends, for its command line and `pass_fds`."""
        return tuple(fd for fd in (self.info_w, self.block_r) if fd >= 0)

    def open(self, uid: int, gid: int, python: str, timeout_s: float) -> None:
        """Once bwrap has started: maps its namespace and lets it go on (`map_zygote_namespace`);
        nothing without a range."""
        if self.uids is None:
            return
        _close(self.info_w, self.block_r)  # bwrap's ends: its report ends if it dies
        self.info_w = self.block_r = -1
        map_zygote_namespace(self.info_r, self.block_w, uid, gid, self.uids, python, timeout_s)

    def close(self) -> None:
        _close(self.info_r, self.info_w, self.block_r, self.block_w)
        self.info_r = self.info_w = self.block_r = self.block_w = -1


def _close(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def uid_in_use(uid: int) -> bool:
    """Whether any process this host sees (zombies included) has ``uid`` as its real, effective
    or saved uid or gid."""
    wanted = str(uid)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as status:
                for line in status:
                    if line.startswith(("Uid:", "Gid:")) and wanted in line.split()[1:4]:
                        return True
        except OSError:
            continue  # gone meanwhile
    return False


class UidPool:
    """Hands out the range's uids, one per live sandbox (used from the event loop only); with
    ``claims``, only those no other backend of this host holds (`uid_claims`)."""

    def __init__(self, uids: UidRange, claims: UidClaims | None = None) -> None:
        self.range = uids
        self._claims = claims
        self._free = collections.deque(range(uids.first, uids.first + uids.count))
        self._given: set[int] = set()
        self._quarantined: set[int] = set()

    def take(self) -> int:
        """A uid no live sandbox has; `Unavailable` when every one is given, in quarantine or
        held by another backend."""
        uid = self._next_free()
        if uid is None:
            self._reclaim()
            uid = self._next_free()
        if uid is None:
            raise Unavailable(
                f"all {self.range.count} sandbox uids are in use "
                f"({len(self._quarantined)} held until their processes are gone)"
            )
        self._given.add(uid)
        return uid

    def _next_free(self) -> int | None:
        """The oldest free uid this backend can claim; one another backend holds goes last."""
        for _ in range(len(self._free)):
            uid = self._free.popleft()
            if self._claims is None or self._claims.claim(uid):
                return uid
            self._free.append(uid)
        return None

    def give_back(self, uid: int, gone: bool) -> None:
        """``gone``: the host read pid 1's exit status (every process of the sandbox is gone);
        otherwise the uid waits in quarantine until /proc shows none with it."""
        if uid not in self._given:
            raise ValueError(f"uid {uid} was not given out")
        self._given.discard(uid)
        if gone:
            self._free.append(uid)
            if self._claims is not None:
                self._claims.release(uid)
        else:
            self._quarantined.add(uid)  # still claimed: no other backend takes it meanwhile

    @property
    def given(self) -> frozenset[int]:
        return frozenset(self._given)

    @property
    def quarantined(self) -> frozenset[int]:
        return frozenset(self._quarantined)

    def _reclaim(self) -> None:
        for uid in sorted(self._quarantined):
            if not uid_in_use(uid):
                self._quarantined.discard(uid)
                self._free.append(uid)
                if self._claims is not None:
                    self._claims.release(uid)

    def close(self) -> None:
        """Releases this backend's claims (at its close, once its sandboxes are gone)."""
        if self._claims is not None:
            self._claims.close()
