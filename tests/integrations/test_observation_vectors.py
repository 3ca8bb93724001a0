"""The shared observation vectors: the Python SDK renders each one as recorded.

tests/data/observation_vectors.json is written by `scripts/gen_observation_vectors.py` and read
by the TypeScript package's test too (clients/typescript/test/observation.test.ts), so a change
to either language's observation that the other does not make fails one of the two suites.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    path = ROOT / "scripts" / "gen_observation_vectors.py"
    spec = importlib.util.spec_from_file_location("gen_observation_vectors", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()
RECORDED: list[dict[str, Any]] = json.loads(GEN.VECTORS.read_text(encoding="utf-8"))


@pytest.mark.parametrize("vector", RECORDED, ids=[v["name"] for v in RECORDED])
def test_the_python_observation_is_the_recorded_one(vector: dict[str, Any]) -> None:
    assert GEN.render(vector) == vector["observation"]


def test_the_file_holds_every_case_of_the_generator() -> None:
    # A case added to the generator but not written out would be checked by Python only.
    assert [{**c, "observation": v["observation"]} for c, v in zip(GEN.cases(), RECORDED)] == (
        RECORDED
    )
    assert len(GEN.cases()) == len(RECORDED)


def test_the_vectors_cover_every_marker_and_section() -> None:
    texts = "\n".join(v["observation"] for v in RECORDED)
    for marker in (
        "[... cut from stdout:",
        "[... cut from value:",
        "[... cut from stderr: first",
        "calls cut: #",
        "chars of arguments cut]",
        " chars cut]",
        "[... observation cut: last",
        "frames of the sandbox runtime hidden",
        "--- violations ---",
        "--- error ---",
        "--- output files ---",
        "--- session lost ---",
        "(checked after the script ended)",
        "(reported from inside the sandbox",
        "show only those fields",
    ):
        assert marker in texts, marker
    assert any(v["observation"] == "status: ok · exit code 0 · 0 tool calls" for v in RECORDED)
