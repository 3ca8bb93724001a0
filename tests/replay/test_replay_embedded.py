"""Replay from Python, embedded: `EmbeddedRunner(audit=...)` records executions whose tools are
plain functions run in this process, and `EmbeddedRunner.replay` re-runs them with every call
answered from the SQLite record (no function runs), expected call counts included.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.backends.fake import FakeBackend
from sandbox.engine import EngineConfig
from sandbox.errors import InvalidArgument, NotFound
from sandbox.expectations import ExpectedCalls
from sandbox.integrations import EmbeddedRunner, RunRequest
from sandbox.options import RunOptions

calls: list[str] = []


def search(query: str) -> list[str]:
    """Searches."""
    calls.append(query)
    if query == "boom":
        raise ValueError("the index is down")
    return [query.upper()]


SCRIPT = """\
import tools
print(tools.search(query="a"))
try:
    tools.search(query="boom")
except tools.ToolError as exc:
    print("error:", exc)
"""


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRunner]:
    audit = tmp_path_factory.mktemp("replay-embedded") / "audit.db"
    with EmbeddedRunner(audit=str(audit)) as embedded:
        yield embedded


def test_functions_replay_identically_with_their_errors(runner: EmbeddedRunner) -> None:
    recorded = runner.run(RunRequest(SCRIPT, tools=[search]))
    assert recorded.stdout == "['A']\nerror: ValueError: the index is down\n"
    assert calls == ["a", "boom"]
    report = runner.replay(recorded.execution_id)
    assert calls == ["a", "boom"]
    assert (report.identical, report.result.stdout) == (True, recorded.stdout)
    assert [c.status for c in report.result.calls] == ["ok", "error"]


def test_an_expected_calls_violation_is_reproduced(runner: EmbeddedRunner) -> None:
    recorded = runner.run(
        RunRequest(
            SCRIPT,
            tools=[search],
            options=RunOptions(expected_calls=(ExpectedCalls("search", min=3),)),
        )
    )
    assert [(v.limit, v.observed) for v in recorded.violations] == [("expected_calls", 2.0)]
    report = runner.replay(recorded.execution_id)
    assert report.identical, [d.detail for d in report.differences]
    assert [(v.limit, v.action) for v in report.result.violations] == [
        ("expected_calls", "reported")
    ]


def test_a_changed_return_schema_changes_nothing_but_a_new_tool_name_does(
    runner: EmbeddedRunner,
) -> None:
    recorded = runner.run(RunRequest(SCRIPT, tools=[search]))

    def search_v2(query: str) -> dict[str, Any]:
        """Searches, answering a mapping now."""
        raise AssertionError("a replay runs no tool")

    search_v2.__name__ = "search"
    assert runner.replay(recorded.execution_id, tools=[search_v2]).identical

    def find(query: str) -> list[str]:
        """Searches under a new name."""
        raise AssertionError("a replay runs no tool")

    report = runner.replay(recorded.execution_id, tools=[find])
    assert [(d.what, d.kind) for d in report.differences][-2:] == [
        ("calls[1]", "missing"),
        ("calls[2]", "missing"),
    ]
    error = {d.what: d for d in report.differences}["error"].replayed
    assert (error["type"], error["message"]) == (
        "AttributeError",
        "module 'tools' has no attribute 'search'",
    )


def test_unknown_id_and_no_store(runner: EmbeddedRunner) -> None:
    with pytest.raises(NotFound) as unknown:
        runner.replay("nope")
    assert unknown.value.message == "execution_id: no execution 'nope'"
    # Without a store (on the fake backend: one process backend per process at a time).
    config = EngineConfig(backends={"process": FakeBackend()})
    with EmbeddedRunner(config) as bare, pytest.raises(InvalidArgument) as no_store:
        bare.replay("nope")
    assert no_store.value.message == "replay: this runner keeps no audit store (pass audit=...)"


def test_the_store_verifies(runner: EmbeddedRunner) -> None:
    store = runner.recorder.store
    assert store is not None
    report = store.verify()
    assert report.ok, report.problems
