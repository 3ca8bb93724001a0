"""A second SIGTERM or Ctrl-C during `ptc serve`'s drain ends the grace at once: the executions
still running are stopped and recorded `interrupted`, and the stop goes on as it would after the
grace (exit 0). Before, a developer at a terminal pressing Ctrl-C twice still waited the whole
grace."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from pathlib import Path

import pytest

from sandbox.client import Client, ExecutionQuery
from sandbox.errors import Unavailable
from sandbox.records import RUNNING
from tests.ptc_serve import ptc_serve

pytestmark = pytest.mark.requires_bwrap

BOUND_S = 30.0  # for what comes at once; far below the grace of 600 s


def _until(condition: str, check: object) -> None:
    until = time.monotonic() + BOUND_S
    while time.monotonic() < until:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"never happened: {condition}")


def _refused(client: Client) -> bool:
    try:
        client.execute("print(1)")
    except Unavailable as exc:
        assert "shutting down" in str(exc), exc
        return True
    return False


def test_a_second_signal_stops_the_running_executions_now(tmp_path: Path) -> None:
    with (
        # The pool first: should the test fail, the server is stopped (and the call with it)
        # before the pool waits for the call.
        concurrent.futures.ThreadPoolExecutor(1) as pool,
        ptc_serve(
            "--grace", "600", "--audit-db", str(tmp_path / "audit.db"), stop_timeout_s=BOUND_S
        ) as serving,
        Client(serving.address) as client,
    ):
        slow = pool.submit(
            client.execute, "import time\ntime.sleep(600)", limits={"wall_time": 600}
        )
        _until(
            "the execution runs",
            lambda: client.list_executions(ExecutionQuery(status=RUNNING)).records,
        )
        os.kill(serving.pid, signal.SIGTERM)
        _until("the drain refuses new executions", lambda: _refused(client))
        assert not slow.done()  # the grace (600 s) lets it run on
        os.kill(serving.pid, signal.SIGINT)  # Ctrl-C; another signal number, never merged
        result = slow.result(timeout=BOUND_S)
    assert result.status == "interrupted", result
    assert (
        "ptc serve: stopping now: 1 executions still running or queued are stopped (those"
        " running recorded interrupted)"
    ) in serving.stderr
