"""`render_compact`: the prompt form of the stub module, what a model actually reads.

Same signatures, types and TypedDicts as the real module, with everything a model does not need
removed: no imports, no bodies (a docstring or ``...``), no ``aio`` duplicates (one header line
says every tool has an async twin), bare typing names, optional parameters shown with their
declared default as a literal (``= ...`` when the tool declares none: omit it and the tool uses
its own), a return annotation only when the tool declares a result type (the header says the rest
return ``Any``), and docstring lines only for arguments with something to say beyond name, type
and default. Built as an ``ast`` so it is valid Python too.
"""

from __future__ import annotations

import ast
from typing import Any

from stubs_gen.annotations import Spelling, type_expr
from stubs_gen.docs import function_doc
from stubs_gen.model import Manifest
from stubs_gen.render import typed_dict_node
from stubs_gen.types import Function

__all__ = ["render_compact"]

COMPACT_DOC = (
    "Call tools.NAME(arg=...) or await tools.aio.NAME(...); bad args raise InvalidArguments, "
    "failures ToolError; unannotated results are Any."
)

_BARE = Spelling(None)


def _value(value: Any) -> ast.expr:
    """A JSON value as a literal expression (for defaults)."""
    if isinstance(value, dict):
        return ast.Dict([ast.Constant(k) for k in value], [_value(v) for v in value.values()])
    if isinstance(value, list):
        return ast.List([_value(v) for v in value])
    return ast.Constant(value)


def _function(function: Function) -> ast.stmt:
    params = function.params
    defaults: list[ast.expr | None] = []
    for p in params:
        if p.required:
            defaults.append(None)
        elif isinstance(p.schema, dict) and "default" in p.schema:
            defaults.append(_value(p.schema["default"]))
        else:
            defaults.append(ast.Constant(...))
    doc = function_doc(function, full=False, indent="    ")
    body: list[ast.stmt] = [ast.Expr(ast.Constant(doc if doc else ...))]
    returns = None if function.returns.kind == "any" else type_expr(function.returns, _BARE)
    return ast.FunctionDef(  # type: ignore[call-arg]
        name=function.name,
        args=ast.arguments(
            posonlyargs=[],
            args=[],
            vararg=None,
            kwonlyargs=[ast.arg(p.ident, type_expr(p.type, _BARE)) for p in params],
            kw_defaults=defaults,
            kwarg=None,
            defaults=[],
        ),
        body=body,
        decorator_list=[],
        returns=returns,
        type_comment=None,
        type_params=[],
        lineno=0,
    )


def render_compact(manifest: Manifest) -> str:
    """The compact, prompt-ready form of the stub module."""
    plan = manifest._plan
    body: list[ast.stmt] = []
    for typed_dict in plan.typed_dicts:
        body += typed_dict_node(typed_dict, _BARE, full=False, runtime=False)
    body += [_function(f) for f in plan.functions]
    return _HEADER + "\n" + ast.unparse(ast.Module(body=body, type_ignores=[])) + "\n"


# Unparsed once at import (it is the same for every manifest).
_HEADER = ast.unparse(ast.Module(body=[ast.Expr(ast.Constant(COMPACT_DOC))], type_ignores=[]))
