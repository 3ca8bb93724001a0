"""The import graph of the execution path: no circle, and no import from a floor to one above.

Reads every module of `sandbox/` with `ast` (nothing is imported), counting every import: at the
top, in functions and under ``TYPE_CHECKING`` (a type-only import still ties the two modules
together for a reader), and the ``__init__`` of every package an import passes through (Python
runs it). docs/architecture.md draws the floors this checks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SANDBOX = ROOT / "sandbox"

# The execution path, floor by floor from the bottom: a module may import its own floor's
# modules and those below, never above. Telemetry and the backends share a floor: the warm pool
# reports to the metrics, which read the pools back at scrape time (no module circle).
FLOORS = [
    ("sandbox.telemetry", "sandbox.backends"),
    ("sandbox.execution",),
    ("sandbox.engine",),
    ("sandbox.sessions", "sandbox.recording"),
]
LONGEST_FUNCTION = 60  # lines, on the wing and the façade


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_name(p): p for p in SANDBOX.rglob("*.py") if "_proto" not in p.parts}


def _graph() -> dict[str, set[str]]:
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                targets.update(f"{base}.{alias.name}" for alias in node.names)
                targets.add(base)
        deps: set[str] = set()
        for target in targets:
            found = resolve(target)
            while found:
                # A module's own packages are already imported when it runs.
                if not (name == found or name.startswith(found + ".")):
                    deps.add(found)
                found = found.rpartition(".")[0] if "." in found else ""
                found = found if found in modules else ""
        graph[name] = deps
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root, first in graph.items():
        if root in index:
            continue
        work = [(root, iter(sorted(first)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _floor(module: str) -> int | None:
    for level, prefixes in enumerate(FLOORS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return level
    return None


def test_no_circle_on_the_execution_path() -> None:
    on_path = [c for c in _circles(_graph()) if any(_floor(m) is not None for m in c)]
    assert on_path == []


def test_no_import_from_a_floor_to_one_above() -> None:
    upward = []
    for module, deps in sorted(_graph().items()):
        floor = _floor(module)
        if floor is None:
            continue
        upward += [
            f"{module} -> {dep}"
            for dep in sorted(deps)
            if (-1 if (above := _floor(dep)) is None else above) > floor
        ]
    assert upward == []


@pytest.mark.parametrize(
    "path",
    sorted([*(SANDBOX / "execution").glob("*.py"), SANDBOX / "engine.py"]),
    ids=lambda p: p.name,
)
def test_no_function_on_the_wing_passes_the_longest(path: Path) -> None:
    tree = ast.parse(path.read_text())
    long = [
        f"{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 >= LONGEST_FUNCTION
    ]
    assert long == []


# -- the audit store by role --------------------------------------------------------------------

AUDIT = SANDBOX / "audit"
LONGEST_AUDIT_MODULE = 400  # lines: a module of the store is one role


@pytest.mark.parametrize("path", sorted(AUDIT.glob("*.py")), ids=lambda p: p.name)
def test_no_module_of_the_audit_store_passes_the_longest(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= LONGEST_AUDIT_MODULE, f"{path.name}: {lines} lines"


def _store_probes() -> list[str]:
    """Every ``getattr(...store..., "name", ...)`` outside the store: a caller that asks the
    store what it can do instead of using its interface (`sandbox.audit.base`)."""
    found = []
    for path in sorted(SANDBOX.rglob("*.py")):
        if "_proto" in path.parts or path.parent == AUDIT:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and node.args
                and "store" in ast.unparse(node.args[0])
            ):
                where = path.relative_to(ROOT)
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_caller_probes_the_audit_store_with_getattr() -> None:
    assert _store_probes() == []
