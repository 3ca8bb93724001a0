"""Shared helpers of the stubs_gen tests: a fake ``_ptc_runtime``, an importer of generated
modules, and BFCL data loading (from the installed ``bfcl_eval`` package).

Inside the sandbox the guest provides ``_ptc_runtime``; here a fake records every call so tests
can check exactly which arguments a stub sends.
"""

from __future__ import annotations

import json
import sys
import types
from importlib import resources
from typing import Any


class ToolError(Exception):
    pass


class InvalidArguments(Exception):
    pass


class CallRefused(Exception):
    pass


class CallDenied(Exception):
    pass


class FakeRuntime:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def call(self, name: str, arguments: dict[str, Any]) -> Any:
        self.calls.append(("sync", name, arguments))
        return {"tool": name, "arguments": arguments}

    async def acall(self, name: str, arguments: dict[str, Any]) -> Any:
        self.calls.append(("async", name, arguments))
        return {"tool": name, "arguments": arguments}


def install_runtime() -> tuple[FakeRuntime, Any]:
    """Put a fake ``_ptc_runtime`` in ``sys.modules``; returns it and what it replaced."""
    fake = FakeRuntime()
    module = types.ModuleType("_ptc_runtime")
    for name, value in {
        "ToolError": ToolError,
        "InvalidArguments": InvalidArguments,
        "CallRefused": CallRefused,
        "CallDenied": CallDenied,
        "call": fake.call,
        "acall": fake.acall,
    }.items():
        setattr(module, name, value)
    previous = sys.modules.get("_ptc_runtime")
    sys.modules["_ptc_runtime"] = module
    return fake, previous


def restore_runtime(previous: Any) -> None:
    if previous is None:
        sys.modules.pop("_ptc_runtime", None)
    else:
        sys.modules["_ptc_runtime"] = previous


def import_source(source: str, name: str = "tools") -> types.ModuleType:
    """Execute generated source as a fresh module (needs the fake runtime installed)."""
    module = types.ModuleType(name)
    # Registered like a real import: TypedDicts resolve their annotations through it.
    sys.modules[name] = module
    exec(compile(source, f"{name}.py", "exec"), module.__dict__)
    return module


CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")


def _lines(path: Any) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def entries(category: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(question entry, possible answer) pairs of one category, matched by id."""
    data = resources.files("bfcl_eval") / "data"
    questions = _lines(data / f"BFCL_v4_{category}.json")
    answers = {a["id"]: a for a in _lines(data / "possible_answer" / f"BFCL_v4_{category}.json")}
    return [(q, answers[q["id"]]) for q in questions]


def _first(value: Any) -> Any:
    """A ground-truth value with BFCL's nested "list of acceptable values" wrappers removed.

    Inside a dict-typed argument BFCL lists acceptable values per key again
    (``{"budget": [{"min": [1], "max": [2]}]}``), also for dicts inside arrays.
    """
    if isinstance(value, dict):
        return ground_truth_arguments(value)
    if isinstance(value, list):
        return [_first(item) for item in value]
    return value


def ground_truth_arguments(acceptable: dict[str, Any]) -> dict[str, Any]:
    """The first acceptable value of each parameter; "" first means the parameter is omitted."""
    out: dict[str, Any] = {}
    for name, values in acceptable.items():
        if not isinstance(values, list):
            out[name] = values
        elif values and values[0] != "":
            out[name] = _first(values[0])
    return out
