"""Sessions in the integrations, embedded: a smolagents `CodeAgent` whose state persists between
code actions, and an execute tool bound to one session per conversation. The same checks run
served in `test_sessions_integrations_served` (one runner kind per module: the fixtures' teardown
checks for leftover processes)."""

from __future__ import annotations

import pytest
from smolagents import CodeAgent

from sandbox.errors import InvalidArgument, NotFound
from sandbox.integrations import ClientRunner, EmbeddedRunner
from sandbox.integrations.execute_tool import ExecuteTool
from sandbox.integrations.runners import RunRequest
from sandbox.integrations.session_runners import open_session
from sandbox.integrations.smolagents import SandboxExecutor
from sandbox.options import RunOptions
from tests.integrations.test_smolagents import CALLS, ScriptedModel, get_weather

STEP_1 = """Thought: fetch the temperatures once.
<code>
temps = {c: get_weather(city=c)["temp_c"] for c in ["Oslo", "Quito"]}
print(len(temps))
</code>"""

STEP_2 = """Thought: `temps` is still there.
<code>
final_answer(max(temps, key=temps.get))
</code>"""


def check_code_agent_keeps_state(runner: ClientRunner | EmbeddedRunner) -> None:
    CALLS.clear()
    model = ScriptedModel([STEP_1, STEP_2])
    with open_session(runner) as conversation:
        agent = CodeAgent(
            tools=[get_weather],
            model=model,
            executor=SandboxExecutor(conversation),
            max_steps=3,
            verbosity_level=0,
        )
        assert agent.run("warmest?") == "Quito"
    assert CALLS == ["Oslo", "Quito"]  # step 2 used the `temps` of step 1: no NameError


def check_execute_tool_per_conversation(runner: ClientRunner | EmbeddedRunner) -> None:
    first_conv = open_session(runner)
    second_conv = open_session(runner)
    try:
        one, two = ExecuteTool(first_conv), ExecuteTool(second_conv)
        assert one.run("n = 1").result.status == "ok"  # type: ignore[union-attr]
        assert two.run("n = 100").result.status == "ok"  # type: ignore[union-attr]
        again = one.run("n += 1\nprint(n)")
        other = two.run("print(n)")
        valued = one.run("n * 10")
        assert "--- value ---\n20" in valued.text
        assert (again.result.stdout, other.result.stdout) == ("2\n", "100\n")  # type: ignore[union-attr]
    finally:
        first_conv.close()
        second_conv.close()
    with pytest.raises(NotFound) as closed:
        first_conv.run(RunRequest("1"))
    assert "is closed: closed by the client" in str(closed.value)


def check_files_and_policy_reach_a_session_cell(runner: ClientRunner | EmbeddedRunner) -> None:
    """An execute tool's input files and script policy apply to its session's cells as to a
    single-use run: the session runners pass the files on."""
    with open_session(runner) as conversation:
        read = ExecuteTool(conversation, files={"notes.txt": b"kept"}).run(
            "print(open('notes.txt').read())"
        )
        refused = ExecuteTool(conversation, policy="restricted").run(
            "x = 1\nprint(getattr(x, 'real'))"
        )
    assert (read.result.status, read.result.stdout) == ("ok", "kept\n")  # type: ignore[union-attr]
    assert refused.result.status == "rejected"  # type: ignore[union-attr]


def check_a_cell_keeps_its_sessions_backend(runner: ClientRunner | EmbeddedRunner) -> None:
    """A cell naming another backend than its session's is refused with the same message on
    both paths (`sandbox.sessions.cells.cell_request`), and the session serves on."""
    with open_session(runner, backend="process") as conversation:
        assert conversation.run(RunRequest("n = 1")).status == "ok"
        with pytest.raises(InvalidArgument) as refused:
            conversation.run(RunRequest("n = 2", options=RunOptions(backend="docker")))
        assert str(refused.value) == (
            f"backend: session {conversation.session_id!r} runs on 'process', not 'docker'"
        )
        kept = conversation.run(RunRequest("print(n)", options=RunOptions(backend="process")))
    assert (kept.status, kept.stdout) == ("ok", "1\n")


def test_a_cell_keeps_its_sessions_backend(embedded: EmbeddedRunner) -> None:
    check_a_cell_keeps_its_sessions_backend(embedded)


def test_files_and_policy_reach_a_session_cell(embedded: EmbeddedRunner) -> None:
    check_files_and_policy_reach_a_session_cell(embedded)


def test_code_agent_keeps_state_between_actions_in_a_session(embedded: EmbeddedRunner) -> None:
    check_code_agent_keeps_state(embedded)


def test_execute_tool_bound_to_one_session_per_conversation(embedded: EmbeddedRunner) -> None:
    check_execute_tool_per_conversation(embedded)
