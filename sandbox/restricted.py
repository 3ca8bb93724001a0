"""The optional `restricted` script policy, checked on the host before any sandbox is taken.

The script is compiled with RestrictedPython, which refuses names and attributes starting with
`_` (the usual way out through `__class__.__subclasses__()`), `exec`/`eval`-style builtins and
other constructs it cannot guard; builtins that reach attributes by a computed name
(`FORBIDDEN_NAMES`) are refused too, since the checks are static (the guest does not load
RestrictedPython's run-time guards); and every import must come from `ALLOWED_IMPORTS`. A refused
script gets status `rejected` with the line and reason. This is defence in depth on top of the
sandbox, never a replacement for it: the sandbox's limits and namespaces apply either way.
"""

from __future__ import annotations

import ast
import re

from RestrictedPython.compile import compile_restricted_exec
from RestrictedPython.transformer import RestrictingNodeTransformer

from sandbox.result import ScriptError

__all__ = ["ALLOWED_IMPORTS", "check_restricted"]

ALLOWED_IMPORTS = frozenset(
    {
        "tools",
        "json",
        "math",
        "cmath",
        "decimal",
        "fractions",
        "random",
        "asyncio",
        "re",
        "datetime",
        "time",
        "collections",
        "itertools",
        "functools",
        "operator",
        "statistics",
        "string",
        "textwrap",
        "typing",
        "dataclasses",
        "enum",
        "heapq",
        "bisect",
        "copy",
        "uuid",
        "hashlib",
        "base64",
        "csv",
        "io",
        "pprint",
    }
)
# Builtins that reach attributes or code by a computed name. RestrictedPython normally guards
# them at run time; the guest runs standard-library-only code, so we refuse them statically.
FORBIDDEN_NAMES = frozenset(
    {
        "getattr",
        "setattr",
        "delattr",
        "vars",
        "globals",
        "locals",
        "compile",
        "exec",
        "eval",
        "open",
        "breakpoint",
        "input",
        "help",
        "memoryview",
        "type",
        "super",
        "object",
    }
)
_LINE = re.compile(r"Line (\d+):")


class _AsyncAwarePolicy(RestrictingNodeTransformer):
    """RestrictedPython's policy, plus `async def`/`await`/`async for`/`async with`, which our
    scripts need for `asyncio.gather` fan-out and which add no way out of the checks."""

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        self.check_name(node, node.name, allow_magic_methods=True)
        self.check_function_argument_names(node)
        return self.node_contents_visit(node)

    def visit_Await(self, node: ast.Await) -> ast.AST:
        return self.node_contents_visit(node)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> ast.AST:
        return self.node_contents_visit(node)

    def visit_AsyncWith(self, node: ast.AsyncWith) -> ast.AST:
        return self.node_contents_visit(node)


def _imports(tree: ast.AST) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append(("." * node.level + (node.module or ""), node.lineno))
            else:
                found.append((node.module or "", node.lineno))
    return found


def check_restricted(script: str) -> ScriptError | None:
    """None when the script passes the policy, else the first reason it does not."""
    tree = ast.parse(script, "<script>")
    for name, line in _imports(tree):
        if name.split(".")[0] not in ALLOWED_IMPORTS:
            allowed = ", ".join(sorted(ALLOWED_IMPORTS))
            return ScriptError(
                "PolicyError", f"import of {name!r} is not allowed (allowed: {allowed})", line
            )
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            return ScriptError(
                "PolicyError",
                f"{node.id!r} is not allowed under the restricted policy",
                node.lineno,
            )
    # Top-level await is legal for us but not for RestrictedPython's module-level compile:
    # check the body wrapped in an async function, which keeps line numbers one-to-one.
    wrapped = ast.Module(
        body=[
            ast.AsyncFunctionDef(
                name="ptc_main",
                args=ast.arguments([], [], None, [], [], None, []),
                body=tree.body or [ast.Pass()],
                decorator_list=[],
                returns=None,
                type_comment=None,
                lineno=1,
                col_offset=0,
            )
        ],
        type_ignores=[],
    )
    ast.fix_missing_locations(wrapped)
    compiled = compile_restricted_exec(wrapped, filename="<script>", policy=_AsyncAwarePolicy)
    errors = list(compiled.errors)
    if errors:
        message = errors[0]
        match = _LINE.search(message)
        line = int(match.group(1)) if match else 0
        reason = _LINE.sub("", message).strip()
        return ScriptError("PolicyError", reason, max(line, 0))
    return None
