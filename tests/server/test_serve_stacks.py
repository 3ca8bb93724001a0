"""`kill -USR1` on `ptc serve`: every thread's and asyncio task's stack on stderr, and the server
goes on serving (nothing is changed or cancelled). The test helper uses it on a stop that never
ends (tests/ptc_serve.py), so that such a failure says what the server waited on."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from sandbox.client import Client
from tests.ptc_serve import ptc_serve

pytestmark = pytest.mark.requires_bwrap


def test_usr1_writes_the_stacks_and_the_server_goes_on() -> None:
    with ptc_serve("--audit-db", "memory") as serving, Client(serving.address) as client:
        assert client.execute("print(1)").stdout == "1\n"
        os.kill(serving.pid, signal.SIGUSR1)
        time.sleep(0.5)  # the dump runs on the server's loop, between two requests
        assert client.execute("print(2)").stdout == "2\n"
    stderr = serving.stderr
    assert re.search(r"--- ptc stacks at \d{4}-\d\d-\d\dT", stderr), stderr
    assert re.search(r"^Thread 0x[0-9a-f]+ \(most recent call first\):$", stderr, re.M), stderr
    tasks = re.search(r"^--- (\d+) asyncio tasks ---$", stderr, re.M)
    assert tasks is not None and int(tasks.group(1)) >= 1, stderr
    # The server's main coroutine, waiting for its stop signal.
    serve = re.search(r"^task \S+ \(_serve\):\n((?:  .*\n)+)", stderr, re.M)
    assert serve is not None, stderr
    # Followed down its awaits: `_serve` awaits the stop event's `wait`, parked on a future.
    assert re.search(r" in _serve\n.* in wait\n  awaiting Future\n$", serve.group(1)), stderr
    assert "--- end of stacks ---" in stderr
