"""`ptc run`'s summary names the script's line only when it is known: a script killed by a
limit has none (no "(line 0)"), a raised exception and a rejected script do."""

from __future__ import annotations

import subprocess

import pytest

from tests.ptc_cli import run_ptc

pytestmark = pytest.mark.requires_bwrap


def ptc_run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_ptc("run", "-", "--allow-degraded", *args, stdin=script, without=("PTC_AUDIT_DB",))


def error_line(stderr: str) -> str:
    (line,) = [x for x in stderr.splitlines() if x.startswith("── error: ")]
    return line


def test_a_killed_script_has_no_line() -> None:
    done = ptc_run("import time\ntime.sleep(30)", "--limit", "wall_time=1")
    assert done.returncode == 3
    assert error_line(done.stderr) == "── error: Killed: the sandbox was killed by signal 9"


def test_a_raised_exception_and_a_rejection_name_their_line() -> None:
    raised = ptc_run("x = 1\nraise ValueError('bad')")
    assert raised.returncode == 1
    assert error_line(raised.stderr) == "── error: ValueError: bad (line 2)"
    rejected = ptc_run("x = 1\nprint(getattr(x, 'real'))", "--policy", "restricted")
    assert rejected.returncode == 4
    assert error_line(rejected.stderr).endswith("(line 2)")
