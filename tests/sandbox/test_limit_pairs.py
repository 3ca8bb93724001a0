"""Limits as the engine applies them: the call budget seen from the script.

The pairs around every limit (just under passes, just over fails with the right violation) run
on every backend: tests/conformance/test_conformance_limits.py; clamping to the ceilings, which
needs no sandbox, runs on the fake backend: tests/backends/test_fake_backend.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.conftest import EngineHarness

ECHO = [
    {
        "name": "echo",
        "description": "Returns its arguments.",
        "parameters": {"type": "object", "properties": {"i": {"type": "integer"}}},
    }
]


def test_refused_call_over_budget_raises_in_the_script(clean: EngineHarness) -> None:
    result = clean.run(
        "import tools\ntools.echo(i=1)\ntry:\n    tools.echo(i=2)\nexcept tools.CallRefused as e:\n    print(e)",
        manifest=ECHO,
        limits={"max_tool_calls": 1},
    )
    assert result.stdout == "the budget of 1 tool calls is spent\n"
    assert [(c.seq, c.status) for c in result.calls] == [(1, "ok"), (2, "refused")]
