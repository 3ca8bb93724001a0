"""Each package of `sandbox/` says what it exports: its ``__all__``, read from the code with `ast`.

| rule | where |
| --- | --- |
| every package declares ``__all__`` | every `__init__.py` |
| ``__all__`` is a literal list of distinct, public names, each bound at the module's top level | every module that declares one |
| a package exports every public name it imports from `sandbox` (a re-export is stated) | every `__init__.py` |

Nothing is imported: a name counts as bound where the module defines, assigns or imports it at
its top level (also under ``if`` or ``try``), as Python would bind it when the module runs.
Generated code (`sandbox/_proto/`) is left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SANDBOX = ROOT / "sandbox"


def _modules() -> list[Path]:
    return [p for p in sorted(SANDBOX.rglob("*.py")) if "_proto" not in p.parts]


def _packages() -> list[Path]:
    return [p for p in _modules() if p.name == "__init__.py"]


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _declared(tree: ast.Module) -> ast.expr | None:
    """The value assigned to ``__all__`` at the top level, if any."""
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return node.value
    return None


def _bound(statements: list[ast.stmt]) -> set[str]:
    """The names these top-level statements bind when the module runs."""
    names: set[str] = set()
    for node in statements:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Import):
            names.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.If):
            names |= _bound(node.body) | _bound(node.orelse)
        elif isinstance(node, ast.Try):
            names |= _bound([*node.body, *node.orelse, *node.finalbody])
            for handler in node.handlers:
                names |= _bound(handler.body)
    return names


def _names(value: ast.expr) -> list[str] | None:
    """The names of a literal list or tuple of strings; None for anything computed."""
    if not isinstance(value, (ast.List, ast.Tuple)):
        return None
    names = [
        e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
    ]
    return names if len(names) == len(value.elts) else None


def test_every_package_declares_all() -> None:
    missing = [_relative(p) for p in _packages() if _declared(ast.parse(p.read_text())) is None]
    assert missing == []


@pytest.mark.parametrize("path", _modules(), ids=_relative)
def test_all_lists_distinct_public_bound_names(path: Path) -> None:
    tree = ast.parse(path.read_text())
    value = _declared(tree)
    if value is None:
        return  # a module need not declare one (test_every_package_declares_all: a package must)
    names = _names(value)
    assert names is not None, "__all__ is not a literal list of strings"
    bound = _bound(tree.body)
    assert [n for n in names if n not in bound] == []  # listed, never bound
    assert [n for n in names if n.startswith("_")] == []  # private names exported
    assert sorted({n for n in names if names.count(n) > 1}) == []  # listed twice


@pytest.mark.parametrize("path", _packages(), ids=_relative)
def test_a_package_exports_what_it_imports(path: Path) -> None:
    tree = ast.parse(path.read_text())
    value = _declared(tree)
    exported = set(_names(value) or []) if value is not None else set()
    imported = [
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sandbox")
        for alias in node.names
    ]
    assert [n for n in imported if not n.startswith("_") and n not in exported] == []
