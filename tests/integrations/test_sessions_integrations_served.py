"""`test_sessions_integrations`' checks through a real server (`ClientRunner`)."""

from __future__ import annotations

from sandbox.integrations import ClientRunner
from tests.integrations.test_sessions_integrations import (
    check_a_cell_keeps_its_sessions_backend,
    check_code_agent_keeps_state,
    check_execute_tool_per_conversation,
    check_files_and_policy_reach_a_session_cell,
)


def test_code_agent_keeps_state_between_actions_in_a_session(served: ClientRunner) -> None:
    check_code_agent_keeps_state(served)


def test_execute_tool_bound_to_one_session_per_conversation(served: ClientRunner) -> None:
    check_execute_tool_per_conversation(served)


def test_files_and_policy_reach_a_session_cell(served: ClientRunner) -> None:
    check_files_and_policy_reach_a_session_cell(served)


def test_a_cell_keeps_its_sessions_backend(served: ClientRunner) -> None:
    check_a_cell_keeps_its_sessions_backend(served)
