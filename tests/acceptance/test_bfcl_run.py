"""BFCL ground truth through the whole pipeline, judged by BFCL's own AST checker.

For every entry of `simple_python`, `multiple`, `parallel` and `parallel_multiple` (data of the
installed `bfcl_eval` package): the entry's functions are the manifest (BFCL's dialect), the script
makes one stub call per expected call with the first acceptable value of each parameter (a
parameter whose first value is "" is omitted), the script runs in a real sandbox, and the call log
(original tool names, arguments as the broker received them) is converted to BFCL's model-output
format and given to `bfcl_eval`'s `ast_checker`, which runs in `.venv-acceptance`
(`scripts/setup_acceptance.sh`). The full set goes through the embedded engine (the API
`ptc run` uses); a sample goes through `ptc run --json` itself.

Entries that fail are exactly those listed, with their reason, under ``"ptc_run"`` in
``tests/data/bfcl_exceptions.json``; the pass rate must be at least 99%.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox.engine import ExecutionRequest
from sandbox.result import ExecutionResult
from stubs_gen import load_manifest

if TYPE_CHECKING:
    from conftest import EngineHarness

pytest.importorskip("bfcl_eval", reason="needs the bfcl-eval data package")

ROOT = Path(__file__).resolve().parents[2]
ACCEPTANCE_PYTHON = ROOT / ".venv-acceptance" / "bin" / "python"
CHECKER = Path(__file__).resolve().parent / "bfcl_check.py"
EXCEPTIONS_FILE = ROOT / "tests" / "data" / "bfcl_exceptions.json"
CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")
CLI_SAMPLE_EVERY = 25  # every 25th entry also goes through `ptc run --json`
CONCURRENCY = 2
CHUNK = 100
EXIT_CODES = {"ok": 0, "error": 1, "limit_exceeded": 3, "rejected": 4}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not ACCEPTANCE_PYTHON.exists(),
        reason="BFCL's checker needs .venv-acceptance: run scripts/setup_acceptance.sh",
    ),
]


def _lines(name: str) -> list[dict[str, Any]]:
    text = (resources.files("bfcl_eval") / "data" / name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def load_category(category: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    questions = _lines(f"BFCL_v4_{category}.json")
    answers = {a["id"]: a for a in _lines(f"possible_answer/BFCL_v4_{category}.json")}
    return [(q, answers[q["id"]]) for q in questions]


def first_value(value: Any) -> Any:
    """BFCL wraps acceptable values in lists, again inside dict-typed arguments."""
    if isinstance(value, dict):
        return first_arguments(value)
    if isinstance(value, list):
        return [first_value(item) for item in value]
    return value


def first_arguments(acceptable: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, values in acceptable.items():
        if not isinstance(values, list):
            out[name] = values
        elif values and values[0] != "":
            out[name] = first_value(values[0])
    return out


def ground_truth_script(functions: list[dict[str, Any]], answer: dict[str, Any]) -> str:
    """One stub call per expected call, keyword arguments under the stubs' Python names."""
    manifest = load_manifest(functions)
    lines = ["import tools"]
    for call in answer["ground_truth"]:
        ((name, acceptable),) = call.items()
        spec = manifest.tool(name)
        assert spec is not None, f"no tool {name!r}"
        ident = {original: py for py, original in spec.param_names.items()}
        values = first_arguments(acceptable)
        # A parameter the tool does not declare is passed as such; the stub will refuse it.
        undeclared = {p: v for p, v in values.items() if p not in ident}
        args = ", ".join(
            [f"{ident[p]}={v!r}" for p, v in values.items() if p in ident]
            + ([f"**{undeclared!r}"] if undeclared else [])
        )
        lines.append(f"tools.{spec.python_name}({args})")
    return "\n".join(lines) + "\n"


def model_output(result: dict[str, Any]) -> list[dict[str, Any]]:
    """A `ptc run --json` call log in BFCL's decoded model-output format."""
    return [{c["tool"]: c["arguments"]} for c in result["calls"] if c["status"] == "ok"]


def run_all(harness: EngineHarness, jobs: list[tuple[str, Any]]) -> list[ExecutionResult]:
    async def go() -> list[ExecutionResult]:
        slots = asyncio.Semaphore(CONCURRENCY)

        async def one(script: str, manifest: Any) -> ExecutionResult:
            async with slots:
                return await harness.engine.execute(ExecutionRequest(script, manifest))

        return await asyncio.gather(*(one(s, m) for s, m in jobs))

    return harness.call(go())


class Checker:
    """BFCL's checker in a long-lived `.venv-acceptance` process (its import takes seconds)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [str(ACCEPTANCE_PYTHON), str(CHECKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def check(self, cases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"cases": cases}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the BFCL checker died (exit {self.proc.poll()})"
        verdicts: dict[str, dict[str, Any]] = json.loads(line)
        return verdicts

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(30)
        self.proc.stdout.close()


@pytest.fixture(scope="module")
def checker() -> Iterator[Checker]:
    c = Checker()
    yield c
    c.close()


def expected_exceptions(category: str) -> dict[str, dict[str, str]]:
    """``{id: {"outcome": start of the failure we must see, "reason": why}}``."""
    data = json.loads(EXCEPTIONS_FILE.read_text(encoding="utf-8"))
    section: dict[str, dict[str, str]] = data.get("ptc_run", {}).get(category, {})
    assert all(item["outcome"] and item["reason"] for item in section.values())
    return section


def failure_reason(result: dict[str, Any], verdict: dict[str, Any]) -> str | None:
    if result["status"] != "ok":
        error = result.get("error") or {}
        return f"status {result['status']}: {error.get('type')}: {error.get('message')}"
    if not verdict["valid"]:
        return f"checker: {verdict['error_type']}: {verdict['error']}"
    return None


def _chunks() -> list[tuple[str, int]]:
    out = []
    for category in CATEGORIES:
        count = len(_lines(f"BFCL_v4_{category}.json"))
        out += [(category, start) for start in range(0, count, CHUNK)]
    return out


@pytest.mark.parametrize(("category", "start"), _chunks(), ids=lambda v: str(v))
def test_bfcl_ground_truth_through_the_sandbox(
    harness: EngineHarness,
    checker: Checker,
    ptc: Callable[..., Any],
    category: str,
    start: int,
    tmp_path: Path,
) -> None:
    entries = load_category(category)[start : start + CHUNK]
    scripts = [ground_truth_script(q["function"], a) for q, a in entries]
    jobs = [(s, q["function"]) for s, (q, _) in zip(scripts, entries, strict=True)]
    as_json = [r.to_json() for r in run_all(harness, jobs)]

    # A sample through the real command line: the same outcome as through the engine.
    for index in range(0, len(entries), CLI_SAMPLE_EVERY):
        question, _ = entries[index]
        manifest = tmp_path / f"{question['id']}.json"
        manifest.write_text(json.dumps(question["function"]))
        proc = ptc("run", "-", "--tools", str(manifest), "--json", stdin=scripts[index])
        via_cli = json.loads(proc.stdout)
        assert (via_cli["status"], model_output(via_cli)) == (
            as_json[index]["status"],
            model_output(as_json[index]),
        )
        assert proc.returncode == EXIT_CODES[via_cli["status"]]

    verdicts = checker.check(
        [
            {
                "id": q["id"],
                "category": category,
                "functions": q["function"],
                "model_output": model_output(r),
                "possible_answer": a["ground_truth"],
            }
            for (q, a), r in zip(entries, as_json, strict=True)
        ]
    )
    failures = {}
    for (question, _), result in zip(entries, as_json, strict=True):
        reason = failure_reason(result, verdicts[question["id"]])
        if reason is not None:
            failures[question["id"]] = reason
    ids = {q["id"] for q, _ in entries}
    expected = {k: v for k, v in expected_exceptions(category).items() if k in ids}
    assert sorted(failures) == sorted(expected), json.dumps(failures, indent=1)[:8000]
    for entry_id, item in expected.items():
        assert failures[entry_id].startswith(item["outcome"]), (entry_id, failures[entry_id])
    assert harness.leftovers(allow={checker.proc.pid}) == []


def test_pass_rate_is_at_least_99_percent() -> None:
    total = sum(len(_lines(f"BFCL_v4_{c}.json")) for c in CATEGORIES)
    excepted = sum(len(expected_exceptions(c)) for c in CATEGORIES)
    assert (total - excepted) / total >= 0.99, f"{excepted} exceptions of {total} entries"
