"""`render_module`: the stub module scripts import as ``tools``, built as an ``ast`` and unparsed.

Building an ``ast`` and printing it with ``ast.unparse`` guarantees valid syntax whatever the
names and descriptions in the manifest; the output depends only on the manifest (no timestamps,
manifest order), so the same manifest gives byte-identical source.

The runtime contract (provided inside the sandbox by the guest as ``_ptc_runtime``):
``call(name, arguments)`` performs a call and returns its result, ``await acall(...)`` is its
async twin, and the exceptions ``ToolError``, ``InvalidArguments``, ``CallRefused`` and
``CallDenied`` are what a failing, badly-called, refused or denied call raises. Each stub's body is
one call into that runtime with a dict of exactly the arguments the script passed, keyed by the
original property names; an omitted optional argument is left out (the private ``_OMITTED``
sentinel is its default), so declared defaults are never injected.
"""

from __future__ import annotations

import ast

from stubs_gen.annotations import Spelling, type_expr
from stubs_gen.docs import function_doc, typed_dict_doc
from stubs_gen.model import Manifest
from stubs_gen.names import is_identifier
from stubs_gen.types import Field, Function, TypedDictDef
from stubs_gen.version import GENERATOR_VERSION

__all__ = ["render_module"]

_BUILTINS = frozenset({"str", "int", "float", "bool", "list", "dict", "tuple"})
_RUNTIME_NAMES = ("ToolError", "InvalidArguments", "CallRefused", "CallDenied")

MODULE_DOC = """\
Typed stubs of the tools this script may call. Import them with `import tools`.

Call a tool as a plain function with keyword arguments: `tools.get_x(id=1)`.
Every tool has an async twin, `tools.aio.<name>`, with the same signature; use it to fan out
many calls at once: `await asyncio.gather(*(tools.aio.get_x(id=i) for i in ids))`.
Top-level `await` is allowed in the script.

Optional arguments you omit are not sent: the tool applies its own default (shown in the
docstring). A call with bad arguments raises `InvalidArguments`; a tool that fails raises
`ToolError`; a call refused by policy raises `CallRefused`, one denied by a reviewer `CallDenied`.
A tool without a declared result type returns `Any`: the tool's JSON result as Python values
(dict, list, str, int, float, bool or None).
"""


def _doc(text: str) -> ast.Expr:
    return ast.Expr(ast.Constant(text))


def _arguments(params: tuple[Field, ...], spelling: Spelling) -> ast.arguments:
    return ast.arguments(
        posonlyargs=[],
        args=[],
        vararg=None,
        kwonlyargs=[ast.arg(p.ident, type_expr(p.type, spelling)) for p in params],
        kw_defaults=[None if p.required else ast.Name("_OMITTED") for p in params],
        kwarg=None,
        defaults=[],
    )


def _payload(params: tuple[Field, ...]) -> ast.expr:
    """``{"orig": ident, ...}`` plus the optional ones that were actually passed."""
    required = [p for p in params if p.required]
    optional = [p for p in params if not p.required]
    keys: list[ast.expr | None] = [ast.Constant(p.key) for p in required]
    values: list[ast.expr] = [ast.Name(p.ident) for p in required]
    if optional:
        passed = ast.DictComp(
            key=ast.Name("k"),
            value=ast.Name("v"),
            generators=[
                ast.comprehension(
                    target=ast.Tuple([ast.Name("k"), ast.Name("v")]),
                    iter=ast.Call(
                        ast.Attribute(
                            ast.Dict(
                                [ast.Constant(p.key) for p in optional],
                                [ast.Name(p.ident) for p in optional],
                            ),
                            "items",
                        ),
                        [],
                        [],
                    ),
                    ifs=[ast.Compare(ast.Name("v"), [ast.IsNot()], [ast.Name("_OMITTED")])],
                    is_async=0,
                )
            ],
        )
        if not required:
            return passed
        keys.append(None)
        values.append(passed)
    return ast.Dict(keys, values)


def _function(function: Function, spelling: Spelling, *, twin: bool) -> ast.stmt:
    call = ast.Call(
        ast.Name("_acall" if twin else "_call"),
        [ast.Constant(function.tool), _payload(function.params)],
        [],
    )
    if twin:
        doc: str | None = f"Async twin of `tools.{function.name}`: the same call, awaitable."
        body_value: ast.expr = ast.Await(call)
    else:
        doc = function_doc(function, full=True, indent="    ")
        body_value = call
    body: list[ast.stmt] = [_doc(doc)] if doc else []
    body.append(ast.Return(body_value))
    node_type = ast.AsyncFunctionDef if twin else ast.FunctionDef
    return node_type(  # type: ignore[call-arg]
        name=function.name,
        args=_arguments(function.params, spelling),
        body=body,
        decorator_list=[ast.Name("staticmethod")] if twin else [],
        returns=type_expr(function.returns, spelling),
        type_comment=None,
        type_params=[],
        lineno=0,
    )


def typed_dict_node(
    typed_dict: TypedDictDef, spelling: Spelling, *, full: bool, runtime: bool
) -> list[ast.stmt]:
    """A TypedDict: for the compact form a class when every key is an identifier; for the real
    module (``runtime``) always the functional form, with each key's type quoted as a forward
    reference but its ``Required``/``NotRequired`` wrapper evaluated, because Python 3.11 loses
    those qualifiers from string annotations (and forward references allow recursive types)."""
    required = sum(1 for f in typed_dict.fields if f.required)
    total = required * 2 >= len(typed_dict.fields)

    def annotation(field: Field) -> ast.expr:
        expr = type_expr(field.type, spelling)
        if runtime:
            expr = ast.Constant(ast.unparse(expr))
        if field.required != total:
            wrapper = "Required" if field.required else "NotRequired"
            expr = ast.Subscript(spelling.typing_name(wrapper), expr)
        return expr

    keywords = [] if total else [ast.keyword("total", ast.Constant(False))]
    doc = typed_dict_doc(typed_dict, full=full, indent="    ")
    class_form = not runtime and all(
        is_identifier(f.key) and not _is_keyword(f.key) and not f.key.startswith("__")
        for f in typed_dict.fields
    )
    if class_form:
        body: list[ast.stmt] = [_doc(doc)] if doc else []
        body += [
            ast.AnnAssign(ast.Name(f.key), annotation(f), None, simple=1) for f in typed_dict.fields
        ]
        return [
            ast.ClassDef(  # type: ignore[call-arg]
                name=typed_dict.name,
                bases=[spelling.typing_name("TypedDict")],
                keywords=keywords,
                body=body,
                decorator_list=[],
                type_params=[],
            )
        ]
    call = ast.Call(
        spelling.typing_name("TypedDict"),
        [
            ast.Constant(typed_dict.name),
            ast.Dict(
                [ast.Constant(f.key) for f in typed_dict.fields],
                [annotation(f) for f in typed_dict.fields],
            ),
        ],
        keywords,
    )
    out: list[ast.stmt] = [ast.Assign([ast.Name(typed_dict.name)], call, lineno=0)]
    if doc:
        out.append(_doc(doc.replace("\n    ", "\n")))
    return out


def _private(name: str) -> bool:
    return name.startswith("__") and not name.endswith("__")


def _mangled(function: Function) -> bool:
    """Whether a class body would mangle the twin's name or one of its parameters."""
    return _private(function.name) or any(_private(p.ident) for p in function.params)


def _is_keyword(name: str) -> bool:
    import keyword

    return keyword.iskeyword(name)


def _header_imports(shadowed: frozenset[str]) -> list[ast.stmt]:
    stmts: list[ast.stmt] = [
        ast.ImportFrom("__future__", [ast.alias("annotations")], 0),
        ast.Import([ast.alias("typing", "_t")]),
    ]
    if shadowed:
        stmts.append(ast.Import([ast.alias("builtins", "_b")]))
    stmts.append(
        ast.ImportFrom(
            "_ptc_runtime",
            [ast.alias(n) for n in _RUNTIME_NAMES]
            + [ast.alias("call", "_call"), ast.alias("acall", "_acall")],
            0,
        )
    )
    return stmts


def _omitted() -> list[ast.stmt]:
    repr_def = ast.FunctionDef(  # type: ignore[call-arg]
        name="__repr__",
        args=ast.arguments(
            posonlyargs=[],
            args=[ast.arg("self")],
            vararg=None,
            kwonlyargs=[],
            kw_defaults=[],
            kwarg=None,
            defaults=[],
        ),
        body=[ast.Return(ast.Constant("..."))],
        decorator_list=[],
        returns=ast.Name("str"),
        type_params=[],
        lineno=0,
    )
    cls = ast.ClassDef(  # type: ignore[call-arg]
        name="_Omitted",
        bases=[],
        keywords=[],
        body=[
            _doc("Default of an optional argument: when omitted, it is not sent at all."),
            repr_def,
        ],
        decorator_list=[],
        type_params=[],
    )
    sentinel = ast.AnnAssign(
        ast.Name("_OMITTED"),
        ast.Attribute(ast.Name("_t"), "Any"),
        ast.Call(ast.Name("_Omitted"), [], []),
        simple=1,
    )
    return [cls, sentinel]


def render_module(manifest: Manifest) -> str:
    """The Python source of the module scripts import as ``tools``."""
    plan = manifest._plan
    shadowed = frozenset(f.name for f in plan.functions) & _BUILTINS
    spelling = Spelling("_t", shadowed)
    body: list[ast.stmt] = []
    for typed_dict in plan.typed_dicts:
        body += typed_dict_node(typed_dict, spelling, full=True, runtime=True)
    body += [_function(f, spelling, twin=False) for f in plan.functions]
    twins: list[ast.stmt] = [
        _doc("Async twins of every tool: `await tools.aio.<name>(...)`, same arguments.")
    ]
    outside: list[ast.stmt] = []
    for function in plan.functions:
        if not _mangled(function):
            twins.append(_function(function, spelling, twin=True))
            continue
        # Inside a class body Python would mangle ``__x`` to ``_aio__x``: define it outside.
        twin = _function(function, spelling, twin=True)
        assert isinstance(twin, ast.AsyncFunctionDef)
        twin.name, twin.decorator_list = "_aio_twin", []
        attach = ast.Call(
            ast.Name("setattr"),
            [
                ast.Name("aio"),
                ast.Constant(function.name),
                ast.Call(ast.Name("staticmethod"), [ast.Name("_aio_twin")], []),
            ],
            [],
        )
        outside += [twin, ast.Expr(attach), ast.Delete([ast.Name("_aio_twin")])]
    body.append(
        ast.ClassDef(  # type: ignore[call-arg]
            name="aio", bases=[], keywords=[], body=twins, decorator_list=[], type_params=[]
        )
    )
    body += outside
    exported = [*_RUNTIME_NAMES, "aio", *(f.name for f in plan.functions)]
    exported += [t.name for t in plan.typed_dicts]
    body.append(
        ast.Assign([ast.Name("__all__")], ast.List([ast.Constant(n) for n in exported]), lineno=0)
    )
    module = ast.Module(body=body, type_ignores=[])
    header = (
        f"# Generated by stubs_gen {GENERATOR_VERSION} from manifest sha256:{manifest.sha256}.\n"
        "# Do not edit: regenerate from the manifest.\n"
    )
    return header + _PREAMBLE[bool(shadowed)] + "\n" + ast.unparse(module) + "\n"


def _preamble(shadowed: bool) -> str:
    """The manifest-independent start of the module (docstring, imports, sentinel)."""
    names = frozenset({"list"}) if shadowed else frozenset()
    nodes = [_doc(MODULE_DOC), *_header_imports(names), *_omitted()]
    return ast.unparse(ast.Module(body=nodes, type_ignores=[]))


# Unparsed once at import: unparsing the long constant docstring dominated generation time.
_PREAMBLE = {False: _preamble(False), True: _preamble(True)}
