"""One uid per sandbox (issue 39): where the host is root with a range of uids to give, each
sandbox's processes run as a uid of its own, so RLIMIT_NPROC counts that sandbox alone.

The backend runs with cgroups turned off (`cgroups=False`), the degraded mode of a host whose
cgroups are read-only, where RLIMIT_NPROC is the only bound on a sandbox's processes. The pair:
the same fork bomb beside the same neighbour, with a uid per sandbox (the neighbour runs
untouched) and with the range turned off (one uid for all: the neighbour's threads are refused).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sandbox.backends.process.uid_claims import UidClaims, counts_per_namespace
from sandbox.backends.process.uid_range import (
    DEFAULT_COUNT,
    DEFAULT_FIRST,
    UidPool,
    UidRange,
    find_range,
    uid_in_use,
)
from sandbox.engine import ExecutionRequest
from sandbox.errors import Unavailable
from sandbox.limits import parse_limit_args
from sandbox.result import ExecutionResult
from tests.backends.test_degraded_threads import THREADS_AND_SUBPROCESSES
from tests.conftest import EngineHarness
from tests.ptc_cli import ROOT

pytestmark = [
    pytest.mark.requires_bwrap,
    pytest.mark.skipif(os.geteuid() != 0, reason="a range of uids to give needs root"),
]

# Forks until the kernel refuses, then holds its processes for a while (the neighbour starts
# meanwhile) before it lets the refusal end it. Its children exec sleep: 63 copies of the
# interpreter would pass the memory limit first (the host sums their resident memory).
HOLDING_BOMB = """
import os, time
count = 0
try:
    while True:
        if os.fork() == 0:
            os.execv("/usr/bin/sleep", ["sleep", "30"])
        count += 1
except BlockingIOError:
    print(count, flush=True)
    time.sleep(3)
    raise
"""
# The neighbour starts once the bomb holds its processes.
NEIGHBOUR = "import time\ntime.sleep(1)\n" + THREADS_AND_SUBPROCESSES.format(threads=8, children=4)
NEIGHBOUR_OUT = "8 [0, 0, 0, 0]\n"


def _request(script: str, **limits: object) -> ExecutionRequest:
    return ExecutionRequest(
        script=script, limits=parse_limit_args(f"{k}={v}" for k, v in limits.items())
    )


def _side_by_side(h: EngineHarness) -> tuple[ExecutionResult, ExecutionResult]:
    async def both() -> tuple[ExecutionResult, ExecutionResult]:
        bomb, other = await asyncio.gather(
            h.engine.execute(_request(HOLDING_BOMB, processes=64, wall_time=20)),
            h.engine.execute(_request(NEIGHBOUR, wall_time=20)),
        )
        return bomb, other

    return h.call(both())


@pytest.fixture
def degraded() -> Iterator[EngineHarness]:
    h = EngineHarness(pool_size=2, allow_degraded=True, cgroups=False)
    yield h
    h.close()
    assert not psutil.Process().children(recursive=True), "sandbox processes survived close()"


def test_a_fork_bomb_beside_threads_touches_only_itself(degraded: EngineHarness) -> None:
    bomb, other = _side_by_side(degraded)
    assert (other.status, other.stdout, other.violations) == ("ok", NEIGHBOUR_OUT, [])
    assert bomb.status == "limit_exceeded", bomb.to_json()
    assert [v.limit for v in bomb.violations] == ["processes"]
    # Its own processes alone reached its limit: pid 1 and what it forked.
    assert bomb.stdout == "63\n", bomb.to_json()
    for result in (bomb, other):
        assert "limit:processes=rlimit" in result.isolation
    uids = [next(i for i in r.isolation if i.startswith("uid:")) for r in (bomb, other)]
    assert uids[0] != uids[1]
    assert all(int(u.split(":")[1]) in degraded.backend.uids.range for u in uids)  # type: ignore[union-attr]
    assert degraded.leftovers() == []


def test_with_one_uid_for_all_the_fork_bomb_starves_its_neighbour() -> None:
    """The pair's other half: the range turned off, as where the server is not root."""
    h = EngineHarness(pool_size=2, allow_degraded=True, cgroups=False, sandbox_uid_count=0)
    try:
        assert h.backend.uids is None
        bomb, other = _side_by_side(h)
        assert other.status != "ok" and other.stdout != NEIGHBOUR_OUT, other.to_json()
        assert [v.limit for v in other.violations] == ["processes"], other.to_json()
        assert [v.limit for v in bomb.violations] == ["processes"], bomb.to_json()
        # Fewer than its own 63: the other sandboxes' processes counted against the same uid.
        assert int(bomb.stdout) < 63, bomb.to_json()
        for result in (bomb, other):
            assert "limit:processes=rlimit-shared" in result.isolation
            assert f"uid:{h.backend.config.uid}" in result.isolation
    finally:
        h.close()


# Holds a thread and two children for a while, so that the test sees them from outside.
LIVE = """
import subprocess, sys, threading, time
go = threading.Event()
thread = threading.Thread(target=go.wait)
thread.start()
children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(4)"]) for _ in range(2)]
time.sleep(4)
go.set()
print(sum(c.wait() for c in children))
"""


def _ids(pid: int) -> tuple[set[int], str] | None:
    """The real, effective and saved uids and gids of a process, and its pid namespace."""
    try:
        with open(f"/proc/{pid}/status") as status:
            lines = status.read().splitlines()
        namespace = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None
    ids = {
        int(value)
        for line in lines
        if line.startswith(("Uid:", "Gid:"))
        for value in line.split()[1:4]
    }
    return ids, namespace


@pytest.mark.parametrize("exit_status", ["pidfd", "reaper"])
def test_two_live_sandboxes_never_share_a_uid(exit_status: str) -> None:
    h = EngineHarness(pool_size=2, allow_degraded=True, cgroups=False, exit_status=exit_status)
    try:
        uids = h.backend.uids
        zygote = h.backend.zygote
        assert uids is not None and zygote is not None and zygote.pids()

        async def five() -> list[ExecutionResult]:
            return list(await asyncio.gather(*(h.engine.execute(_request(LIVE)) for _ in range(5))))

        running = asyncio.run_coroutine_threadsafe(five(), h.loop)
        time.sleep(2.5)  # every script holds its thread and children now
        own_namespace = os.readlink("/proc/self/ns/pid")
        by_namespace: dict[str, set[int]] = defaultdict(set)
        processes: dict[str, int] = defaultdict(int)
        for child in psutil.Process(zygote.pids()[-1]).children(recursive=True):
            seen = _ids(child.pid)
            if seen is None or seen[1] == own_namespace:
                continue  # gone, or a first child or reaper outside the sandbox
            by_namespace[seen[1]] |= seen[0]
            processes[seen[1]] += 1
        results = running.result(60)
        assert [(r.status, r.stdout) for r in results] == [("ok", "0\n")] * 5
        busy = [ns for ns, count in processes.items() if count >= 3]  # pid 1 and two children
        assert len(busy) == 5, dict(processes)
        for namespace, ids in by_namespace.items():
            assert len(ids) == 1, (namespace, ids)  # one uid (and gid) for all its processes
            assert ids <= set(range(uids.range.first, uids.range.first + uids.range.count))
        every = [next(iter(ids)) for ids in by_namespace.values()]
        assert len(set(every)) == len(every), by_namespace
        assert h.leftovers() == []
    finally:
        h.close()


# Leaves processes behind in its pid namespace when it ends: children asleep, a zombie.
LEAVES_PROCESSES = """
import os, subprocess, sys, time
for _ in range(3):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
if os.fork() == 0:
    os._exit(0)
print("left")
"""


def test_a_uid_returns_only_when_no_process_of_its_sandbox_is_left() -> None:
    # Four uids at the top of the mapped range: other backends on the host (another test's,
    # another engineer's) claim from its bottom, and any claim of theirs would keep a uid of
    # these four from going round.
    h = EngineHarness(
        pool_size=1,
        allow_degraded=True,
        cgroups=False,
        sandbox_uid_first=DEFAULT_FIRST + DEFAULT_COUNT - 4,
        sandbox_uid_count=4,
    )
    try:
        pool = h.backend.uids
        assert pool is not None
        returned: list[tuple[int, bool, bool]] = []
        give_back = pool.give_back

        def recording(uid: int, gone: bool) -> None:
            # What /proc shows at the moment the host gives the uid back.
            returned.append((uid, gone, uid_in_use(uid)))
            give_back(uid, gone)

        pool.give_back = recording  # type: ignore[method-assign]
        # Four uids, six sandboxes in turn (and the pool's): each uid is reused.
        for _ in range(6):
            result = h.run(LEAVES_PROCESSES)
            assert (result.status, result.stdout) == ("ok", "left\n"), result.to_json()
        h.call(h.backend.drain())
        assert len(returned) >= 6
        assert [(gone, in_use) for _uid, gone, in_use in returned] == [(True, False)] * len(
            returned
        )
        assert len({uid for uid, _, _ in returned}) == 4  # every uid of the range went round
        assert pool.quarantined == frozenset()
        assert h.leftovers() == []
    finally:
        h.close()


UID = 61500  # outside the default range, which other tests' backends use


def test_a_quarantined_uid_waits_for_its_last_process_zombies_included() -> None:
    pool = UidPool(UidRange(UID, 1))
    holder = subprocess.Popen(
        ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "sleep", "30"]
    )
    try:
        time.sleep(0.2)  # setpriv has exec'd sleep as UID
        assert pool.take() == UID
        pool.give_back(UID, gone=False)  # its end was not seen: quarantined
        with pytest.raises(Unavailable, match="1 held until their processes are gone"):
            pool.take()
        os.kill(holder.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while psutil.Process(holder.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(Unavailable):  # a zombie still counts against RLIMIT_NPROC
            pool.take()
    finally:
        holder.kill()
        holder.wait()
    assert pool.take() == UID
    with pytest.raises(ValueError, match="was not given out"):
        pool.give_back(UID + 1, gone=True)


def test_with_only_the_kubernetes_bases_capabilities() -> None:
    """Root with SYS_ADMIN, SETUID, SETGID and KILL alone, as the base's container: root cannot
    open another uid's /proc map files without DAC_OVERRIDE, so the map is written by a helper
    running as the zygote's uid with SETUID and SETGID (`uid_range`)."""
    done = subprocess.run(
        [
            "setpriv", "--bounding-set=-all,+sys_admin,+setuid,+setgid,+kill", "--inh-caps=-all",
            sys.executable, "-m", "tests.backends.uid_range_driver",
        ],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["range"] == [DEFAULT_FIRST, DEFAULT_COUNT]
    first, second = report["pid1_uids"]
    # Real, effective, saved and filesystem uid: one of the range each, not the same one.
    assert first == [first[0]] * 4 and second == [second[0]] * 4, report
    assert first[0] != second[0], report
    assert {first[0], second[0]} <= set(range(DEFAULT_FIRST, DEFAULT_FIRST + DEFAULT_COUNT))


@pytest.mark.parametrize(
    ("first", "count", "reason"),
    [
        pytest.param(57344, 0, "turned off in the backend's configuration", id="count-0"),
        pytest.param(0, 10, "must leave out root", id="root-in-range"),
        pytest.param(65530, 10, "zygote's uid 65534", id="zygote-uid-in-range"),
        pytest.param(2**32 - 10, 20, "are not all mapped", id="unmapped"),
        pytest.param(1, 5, "holds accounts: ['daemon (1)'", id="accounts"),
    ],
)
def test_a_range_the_host_cannot_give_says_why(first: int, count: int, reason: str) -> None:
    found = find_range(first, count, 65534, 65534)
    assert isinstance(found, str) and reason in found, found


def test_the_default_range_is_given_here() -> None:
    assert find_range(DEFAULT_FIRST, DEFAULT_COUNT, 65534, 65534) == UidRange(
        DEFAULT_FIRST, DEFAULT_COUNT
    )


def test_two_backends_on_one_host_never_give_one_uid() -> None:
    """Each backend's pool knows only its sandboxes: their claims (`uid_claims`) keep a uid one
    of them has given out of the other's hands, and free it when that one closes."""
    first = EngineHarness(pool_size=3, allow_degraded=True, cgroups=False)
    try:
        second = EngineHarness(pool_size=3, allow_degraded=True, cgroups=False)
        try:
            pools = [h.backend.uids for h in (first, second) if h.backend.uids is not None]
            assert len(pools) == 2
            given = [pool.given for pool in pools]
            assert len(given[0]) >= 3 and len(given[1]) >= 3, given
            assert not given[0] & given[1], given
            results = [h.run("import os\nprint(os.getuid())") for h in (first, second)]
            uids = [int(r.stdout) for r in results]
            assert uids[0] != uids[1] and uids[0] not in pools[1].given, (uids, given)
        finally:
            second.close()
        # Closed, the second backend's claims are gone: another backend can take its uids.
        claims = UidClaims.open()
        assert isinstance(claims, UidClaims)
        assert all(claims.claim(uid) for uid in given[1] - pools[0].given)
        claims.close()
    finally:
        first.close()


def test_a_claim_another_holds_is_skipped(tmp_path: Path) -> None:
    mine, theirs = UidClaims(str(tmp_path)), UidClaims(str(tmp_path))
    assert theirs.claim(UID)
    pool = UidPool(UidRange(UID, 2), mine)
    assert pool.take() == UID + 1  # the first is held elsewhere
    with pytest.raises(Unavailable, match="all 2 sandbox uids are in use"):
        pool.take()
    theirs.release(UID)
    assert pool.take() == UID
    pool.give_back(UID, gone=True)
    assert theirs.claim(UID)  # released with the uid
    pool.close()


def test_a_claims_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    open_dir = tmp_path / "claims"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    found = UidClaims.open((str(open_dir),))
    assert isinstance(found, str) and "open to other users (mode 777)" in found, found


@pytest.mark.parametrize(
    ("release", "per_namespace"),
    [
        ("6.18.44-fc-v1252", True),
        ("5.14.0-427.el9.x86_64", True),
        ("5.15.0-105-generic", True),
        ("5.13.19", False),
        ("5.10.0-28-amd64", False),
        ("4.19.0-27-cloud-amd64", False),
        ("5.4", False),
        ("6.1", True),
        ("", False),
        ("linux", False),
    ],
)
def test_a_kernel_before_5_14_counts_a_uid_host_wide(release: str, per_namespace: bool) -> None:
    """Where the kernel counts RLIMIT_NPROC host-wide, the backend warns at start that servers
    in other containers need their own uids (tests/deploy/test_kubernetes_pod_oom.py shows a
    5.14+ kernel counting two containers' sandboxes at one uid apart)."""
    assert counts_per_namespace(release) is per_namespace
