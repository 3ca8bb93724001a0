"""Output written before a kill is never lost, on every backend, embedded and through an
adapter: a script (or session cell) prints three lines on stdout and three on stderr without
flushing, then trips a limit (`tests/output_kills.py`); the result holds all six lines, with the
one violation of that limit, and so does the execute tool's observation that a model reads.

The guest's stdout is line-buffered (`sandbox/guest/bootstrap.py`): with the interpreter's
default block buffer on a pipe, every kill here returned no stdout at all.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from sandbox.backends.docker import engine_client
from sandbox.backends.docker.janitor import owner_label
from sandbox.backends.docker.spec import LABEL_OWNER
from sandbox.backends.factory import BackendOptions, build_backend
from sandbox.engine import EngineConfig
from sandbox.integrations import EmbeddedRunner, ExecuteTool
from sandbox.integrations.session_runners import open_session
from sandbox.limits import Limits, parse_limit_args
from tests.output_kills import KILLS, SESSION_KILLS, STDERR_LINES, STDOUT_LINES, Kill

BACKENDS = [
    pytest.param("process", id="process"),
    pytest.param("docker", id="docker", marks=pytest.mark.requires_docker),
    pytest.param(
        "gvisor", id="gvisor", marks=[pytest.mark.requires_docker, pytest.mark.requires_gvisor]
    ),
]


def _limits(kill: Kill) -> Limits:
    return parse_limit_args(f"{k}={v}" for k, v in kill.limits.items())


def _backend(name: str) -> Any:
    return build_backend(name, BackendOptions(pool_size=1))


@pytest.fixture(scope="module", params=BACKENDS)
def runner(request: pytest.FixtureRequest) -> Iterator[EmbeddedRunner]:
    """An embedded runner on one backend; nothing of it survives its close."""
    backend = _backend(request.param)
    embedded = EmbeddedRunner(
        EngineConfig(backends={request.param: backend}, default_backend=request.param)
    )
    yield embedded
    embedded.close()
    assert psutil.Process(os.getpid()).children(recursive=True) == []
    if request.param != "process":
        client = engine_client.connect(backend.address)
        try:
            owned: dict[str, str | list[str] | bool] = {
                "label": f"{LABEL_OWNER}={owner_label(backend.owner)}"
            }
            assert client.containers.list(all=True, filters=owned, ignore_removed=True) == []
        finally:
            client.close()


def _assert_lines_kept(text: str, stdout: str, stderr: str) -> None:
    assert stdout == STDOUT_LINES
    assert stderr.startswith(STDERR_LINES), stderr
    # What the model reads: the lines, in order, under the observation's stdout header.
    assert f"--- stdout ---\n{STDOUT_LINES}" in text, text


@pytest.mark.parametrize("kill", list(KILLS))
def test_lines_before_a_kill_reach_the_result(runner: EmbeddedRunner, kill: str) -> None:
    path = KILLS[kill]
    observation = ExecuteTool(runner, limits=_limits(path)).run(path.script())
    result = observation.result
    assert result is not None, observation.text
    assert result.status == "limit_exceeded", result.to_json()
    assert [(v.limit, v.action) for v in result.violations] == [path.violation]
    _assert_lines_kept(observation.text, result.stdout, result.stderr)
    # The engine still serves after the kill.
    after = ExecuteTool(runner).run("print('still ok')").result
    assert after is not None and (after.status, after.stdout) == ("ok", "still ok\n")


@pytest.mark.parametrize("kill", list(SESSION_KILLS))
def test_lines_before_a_kill_reach_a_session_cells_result(
    runner: EmbeddedRunner, kill: str
) -> None:
    path = SESSION_KILLS[kill]
    limits = _limits(path)
    with open_session(runner, limits=limits) as session:
        tool = ExecuteTool(session, limits=limits)
        first = tool.run("x = 41")
        assert first.result is not None and first.result.status == "ok", first.text
        observation = tool.run(path.script())
        result = observation.result
        assert result is not None, observation.text
        assert result.status == "limit_exceeded", result.to_json()
        assert [(v.limit, v.action) for v in result.violations] == [path.violation]
        _assert_lines_kept(observation.text, result.stdout, result.stderr)
        assert bool(result.session_lost) == path.ends_session, result.session_lost
        if not path.ends_session:  # the session lives on, with its state and its lines
            after = tool.run("print(x + 1)").result
            assert after is not None and (after.status, after.stdout) == ("ok", "42\n")
