"""`PyType` -> an ``ast`` expression, spelt for the real module or for the compact form.

The real module reaches typing names through the private alias ``_t`` (``_t.Literal``) so a tool
called ``Any`` cannot shadow them, and builtins a tool shadows (a tool named ``list``) through
``_b``. The compact form is read, never run, and uses the bare names.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from stubs_gen.types import PyType

__all__ = ["Spelling", "type_expr"]


@dataclass(frozen=True)
class Spelling:
    typing: str | None  # module alias for typing names, or None for bare names
    shadowed: frozenset[str] = frozenset()  # builtins to reach through ``_b``

    def typing_name(self, name: str) -> ast.expr:
        if self.typing is None:
            return ast.Name(name)
        return ast.Attribute(ast.Name(self.typing), name)

    def builtin(self, name: str) -> ast.expr:
        if name in self.shadowed:
            return ast.Attribute(ast.Name("_b"), name)
        return ast.Name(name)


def type_expr(t: PyType, spelling: Spelling) -> ast.expr:
    """The annotation expression for ``t``."""
    kind = t.kind
    if kind == "any":
        return spelling.typing_name("Any")
    if kind == "name":
        return ast.Constant(None) if t.name == "None" else spelling.builtin(t.name)
    if kind == "ref":
        return ast.Name(t.name)
    if kind == "literal":
        values: list[ast.expr] = [ast.Constant(v) for v in t.values]
        inner: ast.expr = values[0] if len(values) == 1 else ast.Tuple(values)
        return ast.Subscript(spelling.typing_name("Literal"), inner)
    if kind == "list":
        return ast.Subscript(spelling.builtin("list"), type_expr(t.args[0], spelling))
    if kind == "dict":
        pair = ast.Tuple([spelling.builtin("str"), type_expr(t.args[0], spelling)])
        return ast.Subscript(spelling.builtin("dict"), pair)
    if kind == "tuple":
        items = [type_expr(a, spelling) for a in t.args]
        if t.variadic:
            items.append(ast.Constant(...))
        return ast.Subscript(spelling.builtin("tuple"), ast.Tuple(items))
    # union
    expr = type_expr(t.args[0], spelling)
    for member in t.args[1:]:
        expr = ast.BinOp(expr, ast.BitOr(), type_expr(member, spelling))
    return expr
