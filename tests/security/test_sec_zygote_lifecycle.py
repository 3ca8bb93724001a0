"""The zygote's life: replaced after its fork budget, replaced when it dies (its sandboxes
finish), and a zygote that cannot start fails the backend with a clear error.

Each test has a backend of its own (no module-wide harness may be alive beside it, since
leftover checks count every sandbox process of this test process).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.conftest import EngineHarness

from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig
from sandbox.errors import Unavailable

pytestmark = pytest.mark.requires_bwrap


@pytest.fixture(params=[True, False], ids=["c-loop", "python-loop"])
def rotating(
    engine_harness: type[EngineHarness], request: pytest.FixtureRequest
) -> Iterator[EngineHarness]:
    # A retired zygote's `retire` leaves the C loop for the Python one, which waits out its
    # children.
    harness = engine_harness(pool_size=1, zygote_max_forks=3, native_fork_loop=request.param)
    yield harness
    assert harness.leftovers() == []
    harness.close()


def test_the_zygote_is_replaced_after_its_fork_budget(rotating: EngineHarness) -> None:
    zygote = rotating.backend.zygote
    assert zygote is not None
    seeds = []
    for _ in range(7):
        result = rotating.run("print(hash('ptc'))")
        assert result.status == "ok", result.to_json()
        seeds.append(result.stdout)
    assert zygote.generations >= 3
    assert zygote.deaths == 0
    # Children of one zygote share its hash seed (SECURITY.md); a new zygote draws a new one.
    assert len(set(seeds)) >= 2


def test_a_dead_zygote_is_replaced_and_its_sandboxes_finish(
    rotating: EngineHarness, caplog: pytest.LogCaptureFixture
) -> None:
    zygote = rotating.backend.zygote
    assert zygote is not None
    before = zygote.generations
    # An idle pooled sandbox was forked by the zygote that is about to die.
    os.kill(rotating.zygote_pid(), 9)
    with caplog.at_level(logging.WARNING, logger="sandbox.backends.process.zygote"):
        result = rotating.run("import time\ntime.sleep(0.2)\nprint('finished')")
        assert (result.status, result.stdout) == ("ok", "finished\n"), result.to_json()
        rotating.settle()
        again = rotating.run("print('new zygote')")
    assert (again.status, again.stdout) == ("ok", "new zygote\n"), again.to_json()
    assert zygote.generations == before + 1
    assert zygote.deaths == 1
    assert any("starting a new one" in r.getMessage() for r in caplog.records)


def test_a_zygote_that_cannot_start_fails_the_backend_clearly() -> None:
    # true passes the interpreter probe but never says ready.
    backend = ProcessBackend(ProcessBackendConfig(python="/usr/bin/true", pool_size=1))
    loop_error: Exception | None = None
    try:
        asyncio.run(backend.start())
    except Unavailable as exc:
        loop_error = exc
    assert loop_error is not None
    assert "the fork server did not start" in str(loop_error)
    assert backend.zygote is not None and backend.zygote.pids() == []
