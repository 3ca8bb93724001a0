"""The text an execute tool bound to a session gives the model when the server refuses a cell
(the session has ended: closed, lost, expired): tests/data/session_refusal_vectors.json holds
it for each server message, and the TypeScript package's `test/frameworks/session.test.ts`
expects the same text from its session-backed execute tool, so the two cannot drift apart.

The vectors are checked here against the Python execute tool through a real server: the
client turns the status back into its error, and the tool renders the refusal."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from sandbox.errors import from_status
from sandbox.integrations import ClientRunner
from sandbox.integrations.execute_tool import ExecuteTool, _refused
from sandbox.integrations.session_runners import open_session

VECTORS = Path(__file__).resolve().parents[1] / "data" / "session_refusal_vectors.json"
CASES = json.loads(VECTORS.read_text(encoding="utf-8"))


def test_the_vectors_are_there() -> None:
    assert len(CASES) >= 5
    assert {case["code"] for case in CASES} >= {"NOT_FOUND", "FAILED_PRECONDITION"}


@pytest.mark.parametrize("case", CASES, ids=[case["details"][:40] for case in CASES])
def test_each_refusal_renders_as_recorded(case: dict[str, str]) -> None:
    error = from_status(grpc.StatusCode[case["code"]], case["details"])
    assert _refused(error).text == case["text"]


def test_a_closed_session_reads_as_the_first_vector(served: ClientRunner) -> None:
    """The real server's message for a closed session has the first vector's form."""
    conversation = open_session(served)
    tool = ExecuteTool(conversation)
    assert tool.run("x = 1").result.status == "ok"  # type: ignore[union-attr]
    conversation.close()
    observation = tool.run("print(x)")
    expected = CASES[0]["text"].replace("s-4f2a", conversation.session_id)
    assert observation.text == expected
    assert observation.result is None
