"""Sessions through three `ptc serve` on one PostgreSQL behind nginx (the shipped configuration):
the balancer spreads a conversation's cells over every server, and the fleet behaves as one.

- A 20-cell conversation keeps its state although its cells reach all three servers: the ones
  that do not hold the session carry each cell to the one that does, where every cell runs.
- kill -9 of the holder mid-conversation: once its lease expired, the next cell runs on a
  survivor, which rebuilt the session by replaying its recorded cells (each checked against its
  record); the conversation goes on to its 20th cell with its state whole. The dead server's
  other records become `interrupted` within the lease plus a sweep, and the chain verifies.
- A conversation built to be non-reproducible (a cell prints a random number): after kill -9 of
  its holder the next cell is `lost`, naming that cell as the first that differed.
- SIGTERM of the holder hands the session over: the next cell runs on a survivor, nothing lost.

The client retries with a patience that covers the lease (`PATIENT`): until the dead holder's
lease expires, a cell for its session is UNAVAILABLE ("cannot be reached"), which the SDK asks
again with the same idempotency key."""

from __future__ import annotations

import re
import signal
import subprocess
import time

import pytest

from sandbox.client import Client
from sandbox.client.aio import RetryPolicy
from sandbox.client.sessions import SyncSession
from sandbox.errors import FailedPrecondition
from tests.fleet.balancer import Balancer, Fleet
from tests.fleet.conftest import MEMBER_LEASE_TTL_S
from tests.ptc_serve import PYTHON, ROOT

pytestmark = pytest.mark.requires_postgres

CELLS = 20
KILLED_AFTER = 8  # cells run before the holder dies
# Up to 12 attempts, pauses up to 2 s each: well past a 2 s lease and the sweep that follows.
PATIENT = RetryPolicy(attempts=12, backoff_s=0.5, max_backoff_s=2.0)


def _cell(index: int) -> str:
    """Cell ``index`` (0-based): builds on every earlier one (a list, a running total, a file)."""
    if index == 0:
        return "seen = [0]\ntotal = 0\nopen('/tmp/log', 'w').write('0\\n')\nprint(total)"
    return (
        f"seen.append({index})\ntotal += {index}\n"
        f"open('/tmp/log', 'a').write('{index}\\n')\nprint(total, len(seen))"
    )


def _expected(index: int) -> str:
    total = sum(range(index + 1))
    return "0\n" if index == 0 else f"{total} {index + 1}\n"


def _holder(fleet: Fleet, session_id: str) -> str:
    rows = fleet.sql("SELECT instance FROM executions WHERE execution_id = %s", (session_id,))
    assert len(rows) == 1, rows
    return str(rows[0][0])


def _cell_instances(fleet: Fleet, session_id: str) -> list[str]:
    """The instance that ran each cell of the session, in order."""
    rows = fleet.sql(
        "SELECT instance FROM executions WHERE execution_id IN (SELECT execution_id FROM "
        "entries WHERE kind = 'admitted' AND payload LIKE %s) ORDER BY admit_seq",
        (f'%"ptc.session_id":"{session_id}"%',),
    )
    return [str(r[0]) for r in rows]


def _wait_swept(fleet: Fleet, instance: str) -> None:
    """Until no record of ``instance`` is `running`: a survivor swept it (lease plus a sweep)."""
    deadline = time.monotonic() + MEMBER_LEASE_TTL_S + 30
    while fleet.sql(
        "SELECT 1 FROM executions WHERE instance = %s AND status = 'running'", (instance,)
    ):
        assert time.monotonic() < deadline, f"{instance}'s records stayed running"
        time.sleep(0.1)


def _verify(fleet: Fleet) -> None:
    done = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "audit", "verify", "--db", fleet.url],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def _upstreams_used(balancer: Balancer) -> set[str]:
    return set(re.findall(r" (127\.0\.0\.1:\d+) 200$", balancer.access_log(), re.MULTILINE))


def _opened(client: Client) -> SyncSession:
    """A new session of ``client``, which asks again patiently enough to outlast a lease."""
    client.retry = PATIENT
    session = client.session()
    session.create()
    return session


def _converse(session: SyncSession, cells: range) -> None:
    """Cells ``cells`` of the conversation, each checked against what it must print."""
    for index in cells:
        done = session.execute(_cell(index), timeout=120)
        assert (done.status, done.stdout) == ("ok", _expected(index)), done


def test_a_conversation_keeps_its_state_and_outlives_kill_9_of_its_holder(
    three: Fleet, balancer: Balancer
) -> None:
    with Client(balancer.address) as client:
        session = _opened(client)
        first_holder = _holder(three, session.id)
        _converse(session, range(KILLED_AFTER))
        # Every server took some of the requests; every cell ran on the holder.
        assert _upstreams_used(balancer) == set(three.addresses)
        assert _cell_instances(three, session.id) == [first_holder] * KILLED_AFTER

        three.kill(three.index_of(first_holder))
        _converse(session, range(KILLED_AFTER, CELLS))
        final = session.execute("print(open('/tmp/log').read().split() == [str(i) for i in "
                                f"range({CELLS})], sorted(seen) == list(range({CELLS})))")  # fmt: skip
        assert final.stdout == "True True\n"
        new_holder = _holder(three, session.id)
        assert new_holder != first_holder
        ran_on = _cell_instances(three, session.id)
        assert ran_on == [first_holder] * KILLED_AFTER + [new_holder] * (CELLS - KILLED_AFTER + 1)
        session.close()
    _wait_swept(three, first_holder)
    _verify(three)


def test_a_non_reproducible_conversation_is_lost_naming_the_first_cell_that_differs(
    three: Fleet, balancer: Balancer
) -> None:
    with Client(balancer.address) as client:
        session = _opened(client)
        ids = [
            session.execute(script, timeout=120).execution_id
            for script in ("a = 1", "import random\nprint(random.random())", "print(a)")
        ]
        holder = _holder(three, session.id)
        three.kill(three.index_of(holder))
        with pytest.raises(FailedPrecondition) as lost:
            session.execute("print(a + 1)", timeout=120)
    message = lost.value.message
    assert message.startswith(
        f"session_lost: session '{session.id}' is lost: could not be rebuilt on fleet-"
    )
    assert f"cell 2 (execution id {ids[1]}) printed different output: stdout differs" in message
    _wait_swept(three, holder)
    _verify(three)


def test_sigterm_of_the_holder_hands_the_session_over(three: Fleet, balancer: Balancer) -> None:
    with Client(balancer.address) as client:
        session = _opened(client)
        _converse(session, range(5))
        holder = _holder(three, session.id)
        proc = three.procs[three.index_of(holder)]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        _converse(session, range(5, 10))
        assert _holder(three, session.id) != holder
        session.close()
    _verify(three)
