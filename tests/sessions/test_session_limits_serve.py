"""The limits of a session's cells and of the session as a whole, through a real gRPC server on
each backend: a cell that breaks a per-execution limit (output, tool calls, processes, disk,
descriptors) gets its violation and the session lives, with nothing of it charged to the next
cell; the session's total CPU budget ends it with the reason; bad input files are refused
without touching the session's state."""

from __future__ import annotations

import json
import time

import pytest

from sandbox.errors import FailedPrecondition, InvalidArgument, NotFound
from sandbox.result import ExecutionResult

from .conftest import SessionServer

_PARAMS = {"type": "object", "properties": {"q": {"type": "integer"}}}
LOOKUP = json.dumps([{"name": "lookup", "parameters": _PARAMS}])
BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6:\n    pass"


def tripped(result: ExecutionResult) -> list[tuple[str, str]]:
    return [(v.limit, v.action) for v in result.violations]


def test_output_and_tool_call_limits_per_cell(srv: SessionServer) -> None:
    with srv.a.session(LOOKUP, backend=srv.backend) as session:
        loud = session.execute("x = 1\nprint('y' * 5000)", limits={"stdout_bytes": 100})
        after_loud = session.execute("x")
        calls = session.execute(
            "import tools\nfor i in range(3):\n    try:\n        tools.lookup(q=i)\n"
            "    except Exception as exc:\n        print(type(exc).__name__)",
            limits={"max_tool_calls": 1},
        )
        # The budget is per cell: the next cell may call again.
        again = session.execute("tools.lookup(q=9)", limits={"max_tool_calls": 1})
    assert tripped(loud) == [("stdout_bytes", "truncated")]
    assert loud.violations[0].observed == 5001
    assert "4901 bytes dropped of 5001" in loud.stdout
    assert (after_loud.status, after_loud.value, after_loud.violations) == ("ok", "1", [])
    assert tripped(calls) == [("max_tool_calls", "refused")]
    assert calls.stdout == "CallRefused\nCallRefused\n"
    assert [c.status.value for c in calls.calls] == ["ok", "refused", "refused"]
    assert (again.status, again.violations) == ("ok", [])
    assert [c.status.value for c in again.calls] == ["ok"]
    srv.assert_healthy()


def test_a_refused_thread_is_that_cells_violation_only(srv: SessionServer) -> None:
    threads = (
        "import threading, time\nstarted = []\ntry:\n    for _ in range(64):\n"
        "        t = threading.Thread(target=time.sleep, args=(2,))\n        t.start()\n"
        "        started.append(t)\nexcept RuntimeError:\n    print('refused after', len(started))"
    )
    with srv.a.session(backend=srv.backend, limits={"processes": 16}) as session:
        crowded = session.execute(threads)
        # The session's pids counter still holds the refusal: the next cell is not charged.
        after = session.execute("'alive'")
        after_sleepers = session.execute("import time\ntime.sleep(2.2)\n'calm'")
    assert tripped(crowded) == [("processes", "refused")]
    assert crowded.stdout.startswith("refused after ")
    assert 0 < int(crowded.stdout.split()[-1]) < 16
    assert (after.status, after.value, after.violations) == ("ok", "'alive'", [])
    assert (after_sleepers.status, after_sleepers.violations) == ("ok", [])
    srv.assert_healthy()


def test_a_full_disk_is_that_cells_violation_and_the_session_lives(srv: SessionServer) -> None:
    with srv.a.session(backend=srv.backend, limits={"file_size_bytes": 1 << 20}) as session:
        full = session.execute("open('big', 'wb').write(b'x' * (2 << 20))")
        after = session.execute("import os\nos.remove('big')\n'alive'")
    assert tripped(full) == [("file_size", "refused")]
    assert full.error is not None and full.error.type == "OSError"
    assert (after.status, after.value, after.violations) == ("ok", "'alive'", [])
    srv.assert_healthy()


def test_descriptors_run_out_in_one_cell_only(srv: SessionServer) -> None:
    hoard = "import os\nfds = []\nwhile True:\n    fds.append(os.open('/dev/null', os.O_RDONLY))"
    with srv.a.session(backend=srv.backend, limits={"open_files": 64}) as session:
        hoarded = session.execute(hoard)
        after = session.execute("for fd in fds:\n    os.close(fd)\nlen(fds) < 64")
    assert tripped(hoarded) == [("open_files", "refused")]
    assert hoarded.violations[0].evidence.value == "guest"
    assert hoarded.violations[0].observed is None
    assert (after.status, after.value, after.violations) == ("ok", "True", [])
    srv.assert_healthy()


def test_the_total_cpu_budget_ends_the_session(srv: SessionServer) -> None:
    with srv.a.session(backend=srv.backend, limits={"cpu_time_ms": 1500}) as session:
        burns = [session.execute(BURN, limits={"cpu_time_ms": 1000}) for _ in range(3)]
        with pytest.raises(FailedPrecondition) as lost:
            session.execute("print(1)")
    assert [b.status for b in burns[:2]] == ["ok", "ok"]
    assert tripped(burns[2]) == [("cpu_time", "killed")]
    assert burns[2].violations[0].limit_value == 1.5
    observed = burns[2].violations[0].observed
    assert observed is not None and 1.5 <= observed < 2.5
    budget = "cpu_time: the session used its total CPU budget of 1.5 s"
    assert burns[2].session_lost == budget
    assert str(lost.value) == (
        f"session_lost: session '{session.id}' is lost: cell 3 (execution id "
        f"{burns[2].execution_id}): {budget}"
    )
    srv.assert_healthy()


def test_bad_input_files_leave_the_session_as_it_was(srv: SessionServer) -> None:
    with srv.a.session(backend=srv.backend) as session:
        session.execute("x = 41")
        with pytest.raises(InvalidArgument) as too_many:
            session.execute(
                "x = 0", files={f"f{i}": b"" for i in range(5)}, limits={"input_files": 2}
            )
        with pytest.raises(InvalidArgument) as escape:
            session.execute("x = 0", files={"../x": b""})
        after = session.execute("x + 1")
    assert str(too_many.value) == "input_files: 5 files is more than the input_files limit of 2"
    assert str(escape.value) == (
        "input_files: '../x': the file name has a '..' component (no '..', '.' or '//')"
    )
    assert (after.status, after.value) == ("ok", "42")
    srv.assert_healthy()


def test_the_lifetime_ends_the_session_under_a_running_cell(srv: SessionServer) -> None:
    with srv.a.session(backend=srv.backend, max_lifetime=2) as session:
        started = time.monotonic()
        sleeper = session.execute(
            "import time\ntime.sleep(8)\nprint('woke')", limits={"wall_time_ms": 20_000}
        )
        took = time.monotonic() - started
        with pytest.raises(NotFound) as expired:
            session.execute("1")
    reason = "lifetime: reached its maximum lifetime of 2 s"
    # Killed by the session's end, not by a limit of its own: no violation, the reason says why.
    assert (sleeper.status, sleeper.exit_code, sleeper.stdout) == ("error", -9, "")
    assert sleeper.violations == []
    assert sleeper.session_lost == reason
    assert took < 8
    assert str(expired.value) == (
        f"session_lost: session {session.id!r} is expired: cell 1 (execution id "
        f"{sleeper.execution_id}): {reason}"
    )
    srv.assert_healthy()
