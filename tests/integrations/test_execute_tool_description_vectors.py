"""What the execute tool's description tells the model about state: nothing persists between
runs over a single-use runner; over a session runner, everything the earlier runs left is still
there. tests/data/execute_tool_description_vectors.json holds the whole description for each
mode, and the TypeScript package's `test/frameworks/session.test.ts` expects the same text from
its execute tool (`session: true` or not), so that the two languages cannot drift apart.

Checked here against the real tool over a real server: a `ClientRunner`, and a session opened
on it (`open_session`), as `ptc mcp --session` and an agent builder's conversation make one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sandbox.integrations import ClientRunner
from sandbox.integrations.execute_tool import ExecuteTool
from sandbox.integrations.session_runners import open_session

VECTORS = Path(__file__).resolve().parents[1] / "data" / "execute_tool_description_vectors.json"
CASES: list[dict[str, Any]] = json.loads(VECTORS.read_text(encoding="utf-8"))


def test_the_vectors_cover_both_modes() -> None:
    assert {case["session"] for case in CASES} == {False, True}
    assert any(case["tools"] for case in CASES)
    fresh = [c["description"] for c in CASES if not c["session"]]
    kept = [c["description"] for c in CASES if c["session"]]
    assert all("nothing persists between runs" in d for d in fresh)
    assert not any("nothing persists" in d for d in kept)
    assert all("State persists\nbetween runs" in d for d in kept)


@pytest.mark.parametrize("case", CASES, ids=[case["case"] for case in CASES])
def test_each_mode_describes_itself(served: ClientRunner, case: dict[str, Any]) -> None:
    if not case["session"]:
        tool = ExecuteTool(served, case["tools"], instructions=case["instructions"])
        assert tool.description == case["description"]
        return
    with open_session(served) as conversation:
        tool = ExecuteTool(conversation, case["tools"], instructions=case["instructions"])
        assert tool.description == case["description"]
        # And it is the truth: a name the first run sets is there in the second.
        assert tool.run("kept = 6 * 7").result.status == "ok"  # type: ignore[union-attr]
        assert tool.run("print(kept)").result.stdout == "42\n"  # type: ignore[union-attr]
