"""One uid per sandbox through a real `ptc serve` (issue 39), started with the cgroup filesystem
read-only in its mount namespace, as in a non-privileged container, so that it runs degraded
with RLIMIT_NPROC as the only bound on a sandbox's processes: two tenants' executions at once, a
fork bomb and a neighbour's threads and subprocesses; the neighbour runs untouched, the bomb has
its `processes` violation, and the server goes on serving."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from sandbox.client import Client
from sandbox.limits import parse_limit_args
from sandbox.tenants import hash_key
from tests.backends.test_uid_per_sandbox import HOLDING_BOMB, NEIGHBOUR, NEIGHBOUR_OUT
from tests.ptc_serve import Serving, ptc_serve

pytestmark = [
    pytest.mark.requires_bwrap,
    pytest.mark.skipif(os.geteuid() != 0, reason="a range of uids to give needs root"),
]

KEYS = {"alpha": "ptc-test-key-uid-alpha-0123456", "beta": "ptc-test-key-uid-beta-01234567"}
# Every cgroup mount read-only for the server (a mount namespace of its own), then the server.
READ_ONLY_CGROUPS = [
    "unshare", "--mount", "--propagation", "private", "sh", "-ec",
    "for m in $(awk '$5 ~ \"^/sys/fs/cgroup\" {print $5}' /proc/self/mountinfo | sort -r); do"
    ' mount -o remount,bind,ro "$m"; done; exec "$@"',
    "sh",
]  # fmt: skip


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    tenants = tmp_path_factory.mktemp("tenants") / "tenants.toml"
    tenants.write_text(
        "".join(
            f'[[tenant]]\nid = "{name}"\nkeys = ["{hash_key(key)}"]\n' for name, key in KEYS.items()
        )
    )
    args = ["--pool-size", "2", "--audit-db", "memory", "--tenants", str(tenants)]
    with ptc_serve(*args, "--allow-degraded", wrapper=READ_ONLY_CGROUPS) as serving:
        yield serving


def test_one_tenants_fork_bomb_leaves_anothers_threads_alone(served: Serving) -> None:
    with (
        Client(served.address, KEYS["alpha"]) as alpha,
        Client(served.address, KEYS["beta"]) as beta,
        ThreadPoolExecutor(2) as both,
    ):
        bombing = both.submit(
            alpha.execute, HOLDING_BOMB, limits=parse_limit_args(["processes=64", "wall_time=20"])
        )
        neighbouring = both.submit(
            beta.execute, NEIGHBOUR, limits=parse_limit_args(["wall_time=20"])
        )
        bomb, other = bombing.result(60), neighbouring.result(60)
        assert (other.status, other.stdout, other.violations) == ("ok", NEIGHBOUR_OUT, [])
        assert bomb.status == "limit_exceeded", bomb.to_json()
        assert [v.limit for v in bomb.violations] == ["processes"]
        assert bomb.stdout == "63\n", bomb.to_json()
        for result in (bomb, other):
            assert "cgroup:pids" not in result.isolation  # degraded, for real
            assert "limit:processes=rlimit" in result.isolation
        uids = {next(i for i in r.isolation if i.startswith("uid:")) for r in (bomb, other)}
        assert len(uids) == 2, uids
        after = alpha.execute("print('still serving')")
        assert (after.status, after.stdout) == ("ok", "still serving\n")
