"""The container backend's own hostile checks. The cases every backend shares (limit pairs,
exhaustion, host files, privileges, the network) are in tests/conformance/, run on both."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .conftest import DockerHarness


def test_print_runs_in_the_container(dclean: DockerHarness) -> None:
    result = dclean.run(
        "import os, socket\nprint(1, os.getuid(), socket.gethostname())\n"
        "import sys; print('err', file=sys.stderr)"
    )
    assert (result.status, result.exit_code) == ("ok", 0)
    assert result.stdout == "1 65532 sandbox\n"
    assert result.stderr == "err\n"
    assert result.backend == "docker"
    assert {"container", "netns:none", "caps:none", "seccomp:ptc", "init:none"} <= set(
        result.isolation
    )
