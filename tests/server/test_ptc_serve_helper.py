"""The test helper for a real `ptc serve` (tests/ptc_serve.py) fails a test alone when the server
misbehaves, and leaves no process to the tests after it: a stop that never ends is reported with
the time it was given and the process is gone (stop 30's CI: one hung server failed a dozen
later tests through their leftover checks)."""

from __future__ import annotations

import psutil
import pytest

from tests.ptc_serve import ptc_serve

# Says it listens, then ignores SIGTERM (an ignored signal stays ignored across exec).
DEAF = ["sh", "-c", "trap '' TERM; echo 'listening on 127.0.0.1:9'; exec sleep 60", "sh"]


def test_a_stop_that_never_ends_fails_clearly_and_leaves_nothing() -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with (
        pytest.raises(AssertionError, match=r"ptc serve did not stop within 1\.0 s"),
        ptc_serve(wrapper=DEAF, stop_timeout_s=1.0) as serving,
    ):
        assert serving.address == "127.0.0.1:9"
    assert not psutil.pid_exists(serving.pid) or psutil.Process(serving.pid).status() == "zombie"
    assert {p.pid for p in psutil.Process().children(recursive=True)} - before == set()
