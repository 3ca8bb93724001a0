"""An execution on the Docker backend leaves the host's device inodes alone, under runc and
under runsc (gVisor).

runsc gives the container's stdio to its sandbox process, which runs as nobody, by
`fchown(0..2, 65534, 65534)`; an engine's shim hands a container without stdin the host's own
`/dev/null`, so every gVisor container start re-owned the host's `/dev/null` to nobody and moved
its ctime. The backend now gives gVisor containers a stdin pipe instead (`spec.container_kwargs`,
SECURITY.md). The window covers the whole life of the engine's containers: the host is read
before the harness starts its warm pool and after its last container is gone.

Owner and mode of every device are compared exactly, and the ctime of `/dev/null`, the inode the
mechanism touches (a chown moves it even when the owner stays the same); a tty's times move
whenever anyone uses it. On a shared machine another engine's unfixed runsc does the same to
`/dev/null` at any time, so a change counts as ours only when an idle window as long, with no
engine of this test running, shows none; a machine that keeps changing them while idle cannot
tell, and the test says so (skipped with that reason) rather than guessing.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.backends.docker.conftest import DockerHarness

DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
ATTEMPTS = 3


def _host_state() -> dict[str, tuple[int, ...]]:
    """Owner and mode of each device; the ctime of /dev/null too."""
    state: dict[str, tuple[int, ...]] = {}
    for name in DEVICES:
        st = os.stat(f"/dev/{name}")
        state[name] = (st.st_uid, st.st_gid, st.st_mode)
    state["null ctime"] = (os.stat("/dev/null").st_ctime_ns,)
    return state


@pytest.mark.parametrize(
    "runtime", ["runc", pytest.param("runsc", marks=pytest.mark.requires_gvisor)]
)
def test_an_execution_leaves_the_hosts_device_inodes_alone(
    harness_context: Callable[..., contextlib.AbstractContextManager[DockerHarness]],
    runtime: str,
) -> None:
    config = {"backend": "gvisor"} if runtime == "runsc" else {}
    for _ in range(ATTEMPTS):
        before = _host_state()
        started = time.monotonic()
        with harness_context(**config) as harness:
            # The script's stdin is as empty as it was with the engine's /dev/null.
            result = harness.run("import sys\nprint(repr(sys.stdin.read()))")
            assert (result.status, result.exit_code, result.stdout) == ("ok", 0, "''\n")
            assert f"oci-runtime:{runtime}" in result.isolation
        elapsed = time.monotonic() - started
        after = _host_state()
        if after == before:
            return
        idle = _host_state()
        time.sleep(elapsed)
        if _host_state() == idle:
            pytest.fail(
                f"the host's devices changed while the engine ran, and not while idle: {before} "
                f"-> {after}"
            )
    pytest.skip(
        "the host's /dev devices kept changing while no engine of this test ran (another"
        " process on this machine changes them): this run cannot tell whether ours did"
    )
