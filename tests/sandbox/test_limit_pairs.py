"""Limits as the engine applies them: the call budget seen from the script, ceilings.

The pairs around every limit (just under passes, just over fails with the right violation) run
on every backend: tests/conformance/test_conformance_limits.py.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conftest import EngineHarness

ECHO = [
    {
        "name": "echo",
        "description": "Returns its arguments.",
        "parameters": {"type": "object", "properties": {"i": {"type": "integer"}}},
    }
]


@dataclass(frozen=True)
class AtLeast:
    """Equal to any number at least ``value``: a measurement of a time that ran past a limit."""

    value: float

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (int, float)) and other >= self.value


def _pids_peak_kept() -> bool:
    """Whether the kernel keeps pids.peak: cgroup v2 on Linux 6.1 or later."""
    release = tuple(int(p) for p in re.findall(r"\d+", os.uname().release)[:2])
    return Path("/sys/fs/cgroup/cgroup.controllers").exists() and release >= (6, 1)


def test_refused_call_over_budget_raises_in_the_script(clean: EngineHarness) -> None:
    result = clean.run(
        "import tools\ntools.echo(i=1)\ntry:\n    tools.echo(i=2)\nexcept tools.CallRefused as e:\n    print(e)",
        manifest=ECHO,
        limits={"max_tool_calls": 1},
    )
    assert result.stdout == "the budget of 1 tool calls is spent\n"
    assert [(c.seq, c.status) for c in result.calls] == [(1, "ok"), (2, "refused")]


def test_limits_above_the_ceiling_are_clamped_and_reported(clean: EngineHarness) -> None:
    result = clean.run("print(1)", limits={"wall_time": 100_000})
    assert result.status == "ok"
    assert result.effective_limits["wall_time_ms"] == 600_000
    assert [(a.limit, a.requested, a.applied, a.action) for a in result.adjustments] == [
        ("wall_time", 100_000.0, 600.0, "clamped")
    ]
