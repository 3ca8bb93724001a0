"""The process sandbox's device nodes cannot be changed: `/dev` is read-only, so `chmod`,
`utime` and `chown` of `/dev/null`, `zero`, `full`, `random`, `urandom` and `tty` fail with
EROFS from inside, and the host's inodes keep their mode, owner and times.

Where the sandbox's nodes are bind mounts of the host's own device files, a change in place
would reach the host's inode; the assertions on the host's `stat` catch that too.
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.conftest import EngineHarness

DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


def _host_state() -> dict[str, tuple[int, int, int, bool]]:
    """Mode, owner and whether the times are the script's (0): the host's own use of a device
    (a write to a tty) may move its times, so equality of times would be a flaky check."""
    state = {}
    for name in DEVICES:
        st = os.stat(f"/dev/{name}")
        state[name] = (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns == 0 or st.st_atime_ns == 0)
    return state


def test_device_nodes_cannot_be_changed_in_place(clean: EngineHarness) -> None:
    before = _host_state()
    assert not any(touched for *_, touched in before.values())
    result = clean.run(
        f"""
import os
for name in {DEVICES!r}:
    path = "/dev/" + name
    st = os.stat(path)
    for what, change in (
        ("chmod", lambda: os.chmod(path, 0o777)),
        ("utime", lambda: os.utime(path, (0, 0))),
        ("chown", lambda: os.chown(path, os.getuid(), os.getgid())),
    ):
        try:
            change()
            print(name, what, "changed")
        except OSError as exc:
            print(name, what, exc.errno)
"""
    )
    assert (result.status, result.exit_code) == ("ok", 0), result.to_json()
    outcomes = [line.split() for line in result.stdout.splitlines()]
    assert [(name, what) for name, what, _ in outcomes] == [
        (name, what) for name in DEVICES for what in ("chmod", "utime", "chown")
    ]
    # EROFS, not EPERM: the read-only mount refuses before any ownership check, so the
    # outcome does not depend on who owns the host's device files on this machine.
    assert [line for line in outcomes if line[2] != str(errno.EROFS)] == [], result.stdout
    assert _host_state() == before
    clean.assert_healthy()
