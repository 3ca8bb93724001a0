"""Acceptance over BFCL's Python categories (data from the installed ``bfcl_eval`` package).

For every entry: the module compiles and imports, every tool has a stub with the right parameter
names and requiredness, the validator accepts the ground-truth arguments (first acceptable value
of each parameter), and calling the stub sends exactly those arguments under their original
names. Entries that cannot pass are listed with their reason in ``tests/data/bfcl_exceptions.json``
and the test asserts the failures are exactly those.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from stubs_gen import load_manifest, render_compact, render_module
from tests.stubs_gen.stubsgen_support import (
    CATEGORIES,
    FakeRuntime,
    entries,
    ground_truth_arguments,
    import_source,
)

pytest.importorskip("bfcl_eval", reason="needs the bfcl-eval data package")

EXCEPTIONS_FILE = Path(__file__).parents[1] / "data" / "bfcl_exceptions.json"


def _expected_exceptions(category: str) -> dict[str, str]:
    if not EXCEPTIONS_FILE.exists():
        return {}
    data: dict[str, dict[str, str]] = json.loads(EXCEPTIONS_FILE.read_text(encoding="utf-8"))
    return data.get(category, {})


def _optional(prop: Any) -> bool:
    flag = prop.get("optional") if isinstance(prop, dict) else None
    if isinstance(flag, str):
        return flag.strip().lower() == "true"
    return bool(flag)


def _check_entry(entry: dict[str, Any], answer: dict[str, Any], runtime: FakeRuntime) -> str | None:
    tools = entry["function"]
    manifest = load_manifest(tools)
    source = render_module(manifest)
    compile(render_compact(manifest), "compact.py", "exec")
    module = import_source(source)
    for tool in tools:
        spec = manifest.tool(tool["name"])
        assert spec is not None
        stub = getattr(module, spec.python_name)
        assert inspect.iscoroutinefunction(getattr(module.aio, spec.python_name))
        params = inspect.signature(stub).parameters
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
        properties = tool["parameters"].get("properties", {})
        top_optional = set(tool["parameters"].get("optional") or [])
        required = {
            n
            for n in tool["parameters"].get("required", [])
            if not _optional(properties.get(n)) and n not in top_optional
        }
        got = {
            spec.param_names[name]: p.default is inspect.Parameter.empty
            for name, p in params.items()
        }
        want = {name: name in required for name in properties}
        if got != want:
            return f"{tool['name']}: parameters {got} != {want}"
    for call in answer["ground_truth"]:
        ((name, acceptable),) = call.items()
        arguments = ground_truth_arguments(acceptable)
        problems = manifest.validate(name, arguments)
        if problems:
            return f"{name}: ground truth rejected: {problems}"
        spec = manifest.tool(name)
        assert spec is not None
        originals = {v: k for k, v in spec.param_names.items()}
        runtime.calls.clear()
        getattr(module, spec.python_name)(**{originals[k]: v for k, v in arguments.items()})
        if runtime.calls != [("sync", name, arguments)]:
            return f"{name}: sent {runtime.calls} for {arguments}"
    return None


@pytest.mark.parametrize("category", CATEGORIES)
def test_bfcl_category(category: str, runtime: FakeRuntime) -> None:
    failures: dict[str, str] = {}
    for entry, answer in entries(category):
        reason = _check_entry(entry, answer, runtime)
        if reason is not None:
            failures[entry["id"]] = reason
    expected = _expected_exceptions(category)
    assert sorted(failures) == sorted(expected), json.dumps(failures, indent=1)[:6000]
