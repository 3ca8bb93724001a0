"""The shape of `sandbox/`, read from its code: floors, circles, private names, long functions.

Every module of `sandbox/` is read with `ast` (nothing is imported), and every import counts: at
the top, in functions and under ``TYPE_CHECKING`` (a type-only import still ties two modules
together for a reader), with the ``__init__`` of every package an import passes through (Python
runs it). A *package* here is what sits directly under `sandbox/`: a subpackage (`audit/`, with
everything below it) or a module (`engine.py`). The rules:

| rule | test |
| --- | --- |
| the packages' import graph has no circle, so each package has a floor: one above the highest it imports (floor 1 imports nothing of `sandbox`) | `test_every_package_has_a_floor` |
| docs/architecture.md's map of the floors is this graph (`make map` writes it) | `test_the_map_is_the_code` |
| the execution path keeps its order: backends and telemetry, execution, engine, sessions and recording | `test_the_execution_path_keeps_its_order` |
| the guest and `stubs_gen/` import nothing of the host side | `test_the_guest_and_stubs_gen_stand_alone` |
| no circle between modules | `test_no_module_circle` |
| no private name (`_x`) imported from outside the package that holds it | `test_no_private_name_crosses_a_package` |
| no function of `LONGEST_FUNCTION` lines or more, beyond the declared `TABLES` | `test_no_function_passes_the_longest` |

Generated code (`sandbox/_proto/`) is on the map, and exempt from the rules on functions.
"""

from __future__ import annotations

import ast
import itertools
import os
import re
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SANDBOX = ROOT / "sandbox"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
MAP_START = "<!-- floors: written by `make map` from tests/test_layers.py; do not edit by hand -->"
MAP_END = "<!-- end of floors -->"

# The execution path, group by group from the bottom: every package of a group sits on a floor
# below every package of the next. The backends and telemetry are below the execution wing it
# drives; the warm pool reports its starts to the metrics through an observer, importing none.
EXECUTION_PATH = [
    ("sandbox.backends", "sandbox.telemetry"),
    ("sandbox.execution",),
    ("sandbox.engine",),
    ("sandbox.sessions", "sandbox.recording"),
]
STANDALONE = ("sandbox.guest",)  # in-sandbox code: standard library only

LONGEST_FUNCTION = 60  # lines: a function this long or longer fails, outside the two lists below

# Functions that are a table, one declaration a line, not logic: exempt from the length rule.
TABLES = {
    "sandbox/telemetry/metrics.py::Metrics.__init__": "one Prometheus metric per statement",
    "sandbox/commands/run.py::register": "`ptc run`'s options, one argparse call each",
}


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _modules() -> dict[str, Path]:
    return {_name(p): p for p in sorted(SANDBOX.rglob("*.py"))}


def _package_of(name: str) -> str:
    """The package a module runs in: itself for an ``__init__``, else its parent."""
    return name if _modules()[name].name == "__init__.py" else name.rpartition(".")[0]


def _imports(name: str) -> list[tuple[int, str]]:
    """(line, dotted name) of everything a module imports; ``from P import x`` names ``P.x``."""
    path, package = _modules()[name], _package_of(name)
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


@cache
def _graph() -> dict[str, frozenset[str]]:
    """Module -> the modules of `sandbox` it makes Python run.

    ``from P import x`` runs ``P.x`` when that is a module, else ``P`` (x is a name of P's);
    either way the packages above it. A module's own packages are already running when it
    runs, so they count only where it takes a name from one of them."""
    modules = _modules()

    def resolve(dotted: str) -> str:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted

    graph: dict[str, frozenset[str]] = {}
    for name in modules:
        deps: set[str] = set()
        for _, dotted in _imports(name):
            found = resolve(dotted)
            if not found.startswith("sandbox"):
                continue
            if found != name:
                deps.add(found)  # what it names, even one of its own packages
            while "." in found:
                found = found.rpartition(".")[0]
                if not (name == found or name.startswith(found + ".")):
                    deps.add(found)  # a package the import passes through
        graph[name] = frozenset(deps)
    return graph


def _package(module: str) -> str | None:
    """`sandbox.audit` for `sandbox.audit.sqlite`; None for the root package itself."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else None


@cache
def _package_graph() -> dict[str, frozenset[str]]:
    packages: dict[str, set[str]] = {}
    for module, deps in _graph().items():
        if (package := _package(module)) is not None:
            packages.setdefault(package, set()).update(
                p for d in deps if (p := _package(d)) is not None and p != package
            )
    return {package: frozenset(deps) for package, deps in packages.items()}


def _circles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative), sorted."""
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
    return sorted(found)


def floors() -> dict[str, int]:
    """Each package's floor: 1 when it imports nothing of `sandbox`, else one above the highest
    package it imports. Needs a graph without circles (`test_every_package_has_a_floor`)."""
    graph = _package_graph()
    floor: dict[str, int] = {}

    def place(package: str, path: tuple[str, ...]) -> int:
        if package in path:
            raise ValueError(f"import circle: {' -> '.join([*path, package])}")
        if package not in floor:
            below = [place(dep, (*path, package)) for dep in graph[package]]
            floor[package] = 1 + max(below, default=0)
        return floor[package]

    for package in graph:
        place(package, ())
    return floor


def _label(package: str) -> str:
    path = _modules()[package]
    return f"`{package.split('.')[1]}/`" if path.name == "__init__.py" else f"`{path.name}`"


def _summary(package: str) -> str:
    """The first sentence of the package's docstring: what it owns, in its own words."""
    doc = ast.get_docstring(ast.parse(_modules()[package].read_text())) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    return re.split(r"(?<=[.!?])\s", paragraph, maxsplit=1)[0].replace("|", "\\|")


def _reach(package: str) -> set[str]:
    """Every package ``package`` imports, directly or through others."""
    graph, seen, todo = _package_graph(), set[str](), list(_package_graph()[package])
    while todo:
        if (dep := todo.pop()) not in seen:
            seen.add(dep)
            todo += graph[dep]
    return seen


def render_map() -> str:
    """docs/architecture.md's table of floors, from the top floor down. A package's imports are
    listed where no other of its imports reaches them already (the graph's bare edges)."""
    floor, graph = floors(), _package_graph()
    rows = [
        "| floor | package | imports (beside what those import) | what it owns (its docstring) |",
        "| --- | --- | --- | --- |",
    ]
    for package in sorted(graph, key=lambda p: (-floor[p], p)):
        direct = graph[package]
        bare = [d for d in direct if not any(d in _reach(other) for other in direct - {d})]
        imports = ", ".join(_label(d) for d in sorted(bare, key=lambda d: (-floor[d], d)))
        rows.append(f"| {floor[package]} | {_label(package)} | {imports} | {_summary(package)} |")
    return "\n".join(rows)


def _written_map() -> str:
    text = ARCHITECTURE.read_text()
    assert MAP_START in text and MAP_END in text, f"{ARCHITECTURE}: the map's markers are gone"
    return text.split(MAP_START, 1)[1].split(MAP_END, 1)[0].strip()


def write_map() -> None:
    """Writes the map between its markers in docs/architecture.md (`make map`)."""
    text = ARCHITECTURE.read_text()
    head, rest = text.split(MAP_START, 1)
    tail = rest.split(MAP_END, 1)[1]
    ARCHITECTURE.write_text(f"{head}{MAP_START}\n{render_map()}\n{MAP_END}{tail}")


def test_every_package_has_a_floor() -> None:
    assert _circles(_package_graph()) == []
    placed = floors()
    unplaced = [m for m in _modules() if (p := _package(m)) is not None and p not in placed]
    assert unplaced == []
    assert _graph()["sandbox"] == frozenset()  # the root package imports nothing


def test_the_map_is_the_code() -> None:
    assert _written_map() == render_map(), "docs/architecture.md's floors are stale: make map"


def test_the_execution_path_keeps_its_order() -> None:
    floor = floors()
    steps = [[(floor[p], p) for p in group] for group in EXECUTION_PATH]
    inverted = [
        (max(low), min(high)) for low, high in itertools.pairwise(steps) if max(low) >= min(high)
    ]
    assert inverted == []


def test_the_guest_and_stubs_gen_stand_alone() -> None:
    graph = _package_graph()
    assert {p: sorted(graph[p]) for p in STANDALONE} == {p: [] for p in STANDALONE}
    host = [
        f"{path.relative_to(ROOT)}: {dotted}"
        for path in sorted((ROOT / "stubs_gen").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for dotted in (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        )
        if dotted == "sandbox" or dotted.startswith("sandbox.")
    ]
    assert host == []


def test_no_module_circle() -> None:
    assert _circles(_graph()) == []


def _private_imports() -> list[str]:
    """`path:line imports NAME` for each private name taken from outside the package that holds
    it (a private module's package, or the package of the module whose private name it is)."""
    modules, crossing = _modules(), []
    for name, path in modules.items():
        for line, dotted in _imports(name):
            parts = dotted.split(".")
            private = next(
                (i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")),
                None,
            )
            if parts[0] != "sandbox" or private is None:
                continue
            holder = ".".join(parts[:private])
            if holder in modules and modules[holder].name != "__init__.py":
                holder = holder.rpartition(".")[0]  # `_x` of module M: M's package holds it
            if not (name == holder or name.startswith(holder + ".")):
                crossing.append(f"{path.relative_to(ROOT)}:{line} imports {dotted}")
    return crossing


def test_no_private_name_crosses_a_package() -> None:
    assert _private_imports() == []


def _function_lengths() -> dict[str, int]:
    """`path::Qualified.name` -> lines, for every function of `sandbox/` but generated code."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, path: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert child.end_lineno is not None
                lengths[f"{path}::{prefix}{child.name}"] = child.end_lineno - child.lineno + 1
                visit(child, path, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, path, f"{prefix}{child.name}.")
            else:
                visit(child, path, prefix)

    for path in _modules().values():
        if "_proto" not in path.parts:
            visit(ast.parse(path.read_text()), str(path.relative_to(ROOT)), "")
    return lengths


def test_no_function_passes_the_longest() -> None:
    lengths = _function_lengths()
    assert sorted(set(TABLES) - set(lengths)) == []  # a declared table that is gone
    long = {
        name: lines
        for name, lines in lengths.items()
        if lines >= LONGEST_FUNCTION and name not in TABLES
    }
    assert long == {}


if __name__ == "__main__":
    write_map()
    sys.stdout.write(f"{os.path.relpath(ARCHITECTURE)}: floors written\n")


# -- the audit store by role --------------------------------------------------------------------

AUDIT = SANDBOX / "audit"
LONGEST_AUDIT_MODULE = 400  # lines: a module of the store is one role


def test_no_module_of_the_audit_store_passes_the_longest() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in sorted(AUDIT.glob("*.py"))}
    assert len(sizes) > 10  # the store's modules are where this looks
    assert {name: n for name, n in sizes.items() if n > LONGEST_AUDIT_MODULE} == {}


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
