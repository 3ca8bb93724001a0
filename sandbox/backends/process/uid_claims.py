"""Claims on sandbox uids shared by every process backend of this host: a uid that one backend
has given to a live sandbox is never given by another (`uid_range` has the pool of each).

Why: a backend's pool knows only its own sandboxes, and every backend started as root gives
from the same range: two servers on one host, or a server and a `ptc run`, would otherwise give
one uid to two live sandboxes, whose processes RLIMIT_NPROC would then count together (and which
could signal each other's processes). Each claim is an exclusive flock(2) on a file named after
the uid in a directory only root can enter, held for as long as the uid is given (or in
quarantine) and released by closing it; the kernel releases the claims of a backend whose
process died, whose sandboxes its zygote kills when that process's end closes its control
socket. Backends in separate containers or user namespaces share no such directory, and for
RLIMIT_NPROC need none: since Linux 5.14 the kernel counts processes per user namespace and
uid, and each backend's zygote has a user namespace of its own, so two servers' sandboxes at
one host uid are counted apart (tests/deploy/test_kubernetes_pod_oom.py: two containers of the
Kubernetes base, a fork bomb and another sandbox's threads at the same uid, the other `ok`);
separate pid namespaces keep them from signalling each other. On an older kernel a uid's count
is host-wide: there each needs a range of its own (`ProcessBackendConfig.sandbox_uid_first`; in
Kubernetes every pod with a user namespace has host uids of its own).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile

__all__ = ["CLAIM_DIRS", "UidClaims", "counts_per_namespace"]

# /run where it is writable (a host); else the temporary directory (a read-only container root
# with a writable /tmp, as the Kubernetes base has).
CLAIM_DIRS = ("/run/ptc-sandbox-uids", os.path.join(tempfile.gettempdir(), "ptc-sandbox-uids"))


# Linux 5.14 counts RLIMIT_NPROC per user namespace and uid (ucounts); before, per uid host-wide.
_PER_NAMESPACE_SINCE = (5, 14)


def counts_per_namespace(release: str) -> bool:
    """Whether a kernel of this release (`os.uname().release`, e.g. ``6.1.0-18-amd64``) counts a
    uid's processes per user namespace: then servers in separate containers may give the same
    uids; else they share each uid's count and need ranges of their own. An unreadable release
    counts as the older kernel (the warning errs towards being said)."""
    parts = release.split(".", 2)
    try:
        version = (int(parts[0]), int("".join(c for c in parts[1][:3] if c.isdigit())))
    except (IndexError, ValueError):
        return False
    return version >= _PER_NAMESPACE_SINCE


class UidClaims:
    """This backend's claims, each an open descriptor holding its file's lock."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._held: dict[int, int] = {}

    @classmethod
    def open(cls, candidates: tuple[str, ...] = CLAIM_DIRS) -> UidClaims | str:
        """The claims directory, made if need be; or why none can be trusted (a directory that
        another user could write to would let it hold every uid, or free one that is given)."""
        reasons = []
        for directory in candidates:
            with contextlib.suppress(FileExistsError, OSError):
                os.mkdir(directory, 0o700)
            try:
                info = os.lstat(directory)
            except OSError as exc:
                reasons.append(f"{directory}: {exc.strerror}")
                continue
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                reasons.append(f"{directory} is not a directory of uid {os.geteuid()}")
            elif info.st_mode & 0o077:
                reasons.append(
                    f"{directory} is open to other users (mode {stat.S_IMODE(info.st_mode):o})"
                )
            elif not os.access(directory, os.W_OK | os.X_OK):
                reasons.append(f"{directory} is not writable")
            else:
                return cls(directory)
        return "no directory for the claims on sandbox uids: " + "; ".join(reasons)

    def claim(self, uid: int) -> bool:
        """Holds ``uid`` for this backend; False when another backend of this host holds it."""
        if uid in self._held:
            return True
        fd = os.open(
            os.path.join(self.directory, str(uid)),
            os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
            0o600,
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._held[uid] = fd
        return True

    def release(self, uid: int) -> None:
        fd = self._held.pop(uid, None)
        if fd is not None:
            os.close(fd)  # the lock goes with the last descriptor of its open file

    def close(self) -> None:
        for uid in list(self._held):
            self.release(uid)
