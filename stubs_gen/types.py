"""JSON Schema -> Python type annotations, and the TypedDicts they need.

Owns the typed plan of a manifest (`Plan`): one `Function` per tool (keyword parameters, required
first, each with its type, requiredness, default and schema for the docstring), and the
`TypedDictDef`s they reference, collected once across the manifest and named after tool and
property (``GetWeatherOptions``) or after their ``$defs`` key; identical definitions are shared.

Types are a small tree (`PyType`) that `render.py` and `compact.py` print with or without the
``_t.`` typing prefix. Mapping: string/integer/number/boolean/null -> ``str``/``int``/``float``/
``bool``/``None``; arrays -> ``list[T]``; ``prefixItems`` and BFCL tuples -> ``tuple[...]``; objects
with properties -> TypedDict; other objects -> ``dict[str, T]``; ``enum``/``const`` ->
``Literal[...]``; ``anyOf``/``oneOf``/type lists -> unions; nullable -> ``X | None``. A valid
construct with no Python spelling (a ``false`` schema, an empty ``enum``, an ``allOf`` of
non-objects, a recursive non-object ``$ref``, extreme nesting) degrades to ``Any`` with a warning
naming tool and JSON path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from stubs_gen.content import CONTENT_TYPES
from stubs_gen.errors import ManifestError
from stubs_gen.jsonpath import index, key
from stubs_gen.names import PARAM_RESERVED, TYPE_RESERVED, collision, pascal, python_name

__all__ = ["Field", "Function", "Plan", "PyType", "TypedDictDef", "plan_tools"]

MAX_TYPE_DEPTH = 24
_TYPING_KEYS = frozenset(
    {
        "type",
        "$ref",
        "enum",
        "const",
        "properties",
        "items",
        "prefixItems",
        "anyOf",
        "oneOf",
        "allOf",
        "additionalProperties",
    }
)


@dataclass(frozen=True)
class PyType:
    """A Python type: ``kind`` is any, name (``str``/``int``/...), literal, list, tuple, dict,
    union or ref (a TypedDict by name)."""

    kind: str
    name: str = ""
    args: tuple[PyType, ...] = ()
    values: tuple[Any, ...] = ()
    variadic: bool = False


ANY = PyType("any")
NONE = PyType("name", "None")
_PRIMS = {
    "string": PyType("name", "str"),
    "integer": PyType("name", "int"),
    "number": PyType("name", "float"),
    "boolean": PyType("name", "bool"),
    "null": NONE,
}


def union(members: list[PyType]) -> PyType:
    """Flattened, de-duplicated union; literals merged; ``None`` last; ``Any`` absorbs all."""
    flat: list[PyType] = []
    literals: list[Any] = []
    seen_literals: set[tuple[type, Any]] = set()
    has_none = False
    for member in members:
        parts = member.args if member.kind == "union" else (member,)
        for part in parts:
            if part.kind == "any":
                return ANY
            if part == NONE:
                has_none = True
            elif part.kind == "literal":
                for value in part.values:
                    if (type(value), value) not in seen_literals:
                        seen_literals.add((type(value), value))
                        literals.append(value)
            elif part not in flat:
                flat.append(part)
    if literals:
        flat.insert(0, PyType("literal", values=tuple(literals)))
    if has_none:
        flat.append(NONE)
    if not flat:
        return ANY
    return flat[0] if len(flat) == 1 else PyType("union", args=tuple(flat))


@dataclass(frozen=True)
class Field:
    """A parameter of a stub or a key of a TypedDict."""

    key: str  # original property name
    ident: str  # Python parameter name (== key for TypedDict keys)
    type: PyType
    required: bool
    schema: Any  # the property's schema, for its docstring line


@dataclass(frozen=True)
class TypedDictDef:
    name: str
    description: str
    fields: tuple[Field, ...]


@dataclass(frozen=True)
class Function:
    tool: str
    name: str
    description: str
    params: tuple[Field, ...]
    returns: PyType
    returns_schema: Any


@dataclass(frozen=True)
class Plan:
    functions: tuple[Function, ...]
    typed_dicts: tuple[TypedDictDef, ...]


_LITERAL_OK = (str, int, bool)


def _literal(values: list[Any]) -> PyType:
    members: list[PyType] = []
    literal: list[Any] = []
    for value in values:
        if value is None:
            members.append(NONE)
        elif isinstance(value, _LITERAL_OK):
            literal.append(value)
        elif isinstance(value, float):
            members.append(_PRIMS["number"])
        elif isinstance(value, list):
            members.append(PyType("list", args=(ANY,)))
        else:
            members.append(PyType("dict", args=(ANY,)))
    if literal:
        members.insert(0, PyType("literal", values=tuple(literal)))
    return union(members)


class _Planner:
    def __init__(self, taken: set[str]) -> None:
        self.taken = set(taken) | TYPE_RESERVED
        self.typed_dicts: list[TypedDictDef] = []
        self.shared: dict[tuple[str, str], str] = {}
        self.warnings: list[str] = []
        # per tool
        self.tool = ""
        self.root: Any = None
        self.ref_names: dict[str, str] = {}
        self.resolving: set[str] = set()

    def warn(self, path: str, what: str) -> None:
        self.warnings.append(f"tool {self.tool!r} at {path}: {what}; degraded to Any")

    def unique(self, preferred: str) -> str:
        name, n = preferred, 2
        while name in self.taken:
            name, n = f"{preferred}{n}", n + 1
        self.taken.add(name)
        return name

    def deref(self, schema: Any) -> Any:
        seen = 0
        while isinstance(schema, dict) and "$ref" in schema and seen < 32:
            schema = self.pointer(schema["$ref"])
            seen += 1
        return schema

    def pointer(self, ref: str) -> Any:
        node = self.root
        if ref == "#":
            return node
        for raw in ref[2:].split("/"):
            part = raw.replace("~1", "/").replace("~0", "~")
            node = node[int(part)] if isinstance(node, list) else node[part]
        return node

    # -- functions ------------------------------------------------------------------------

    def function(
        self,
        tool: str,
        name: str,
        description: str,
        schema: dict[str, Any],
        output: Any,
        path: str,
        output_path: str,
    ) -> Function:
        self.tool, self.root, self.ref_names, self.resolving = tool, schema, {}, set()
        ctx = pascal(name)
        properties, required, path = self.object_parts(schema, path)
        fields = self.fields(properties, required, ctx, path, as_params=True)
        params = sorted(fields, key=lambda f: not f.required)  # stable: declaration order kept
        returns: PyType = ANY
        if output is not None:
            self.root, self.ref_names, self.resolving = output, {}, set()
            returns = self.convert(output, f"{ctx}Result", output_path, 0)
        return Function(tool, name, description, tuple(params), returns, output)

    def object_parts(self, schema: Any, path: str) -> tuple[dict[str, Any], list[str], str]:
        """Properties and required names of an object schema, through ``$ref`` and ``allOf``."""
        schema = self.deref(schema)
        if not isinstance(schema, dict):
            return {}, [], path
        properties = dict(schema.get("properties") or {})
        required = list(schema.get("required") or [])
        for position, raw in enumerate(schema.get("allOf") or []):
            member = self.deref(raw)
            if isinstance(member, dict):
                properties.update(member.get("properties") or {})
                required += [n for n in member.get("required") or [] if n not in required]
            elif member is False:
                self.warn(index(key(path, "allOf"), position), "a false schema")
        return properties, required, key(path, "properties")

    def fields(
        self,
        properties: dict[str, Any],
        required: list[str],
        ctx: str,
        path: str,
        *,
        as_params: bool,
    ) -> list[Field]:
        out: list[Field] = []
        idents: dict[str, str] = {}
        names = list(properties)
        for name in required:
            if name not in properties:
                names.append(name)
                self.warn(path, f"required property {name!r} is not declared")
        for name in names:
            where = key(path, name)
            prop = properties.get(name, True)
            ident = name
            if as_params:
                ident = python_name(name)
                if ident in PARAM_RESERVED:
                    ident += "_"
                if ident in idents:
                    raise ManifestError(
                        collision("parameters", idents[ident], name, ident),
                        tool=self.tool,
                        path=where,
                    )
                idents[ident] = name
            field_type = self.convert(prop, ctx + pascal(name), where, 0)
            out.append(Field(name, ident, field_type, name in required, prop))
        return out

    # -- types ----------------------------------------------------------------------------

    def convert(self, schema: Any, ctx: str, path: str, depth: int) -> PyType:
        if schema is True or schema == {}:
            return ANY
        if schema is False:
            self.warn(path, "a false schema accepts no value")
            return ANY
        if not isinstance(schema, dict):
            return ANY
        if depth > MAX_TYPE_DEPTH:
            self.warn(path, f"types nested more than {MAX_TYPE_DEPTH} levels deep")
            return ANY
        sub = depth + 1
        if "$ref" in schema and "type" not in schema and "properties" not in schema:
            return self.reference(schema["$ref"], path, sub)
        if "const" in schema:
            return _literal([schema["const"]])
        if "enum" in schema:
            if not schema["enum"]:
                self.warn(key(path, "enum"), "an empty enum accepts no value")
                return ANY
            return _literal(schema["enum"])
        for combinator in ("anyOf", "oneOf"):
            if combinator in schema:
                found = self.alternatives(schema, combinator, ctx, path, sub)
                if found is not None:
                    return found
        if "allOf" in schema:
            return self.all_of(schema, ctx, path, sub)
        return self.typed(schema, ctx, path, sub)

    def alternatives(
        self, schema: dict[str, Any], combinator: str, ctx: str, path: str, depth: int
    ) -> PyType | None:
        members = schema[combinator]
        typing_members = [m for m in members if isinstance(m, dict) and _TYPING_KEYS & m.keys()]
        if not typing_members:
            return None  # constraint-only alternatives: the sibling keywords give the type
        objects = sum(1 for m in members if isinstance(m, dict) and "properties" in m)
        where = key(path, combinator)
        converted = [
            self.convert(m, ctx if objects <= 1 else f"{ctx}{i + 1}", index(where, i), depth)
            for i, m in enumerate(members)
        ]
        result = union(converted)
        if result.kind == "any" and "type" in schema:
            return None
        return result

    def all_of(self, schema: dict[str, Any], ctx: str, path: str, depth: int) -> PyType:
        members = [self.deref(m) for m in schema["allOf"]]
        if all(isinstance(m, dict) and _is_object(m) for m in members) or _is_object(schema):
            properties, required, _ = self.object_parts(schema, path)
            if properties:
                return self.typed_dict(schema, properties, required, ctx, path)
            return PyType("dict", args=(ANY,))
        typing_members = [m for m in members if isinstance(m, dict) and _TYPING_KEYS & m.keys()]
        if len(typing_members) == 1 and "type" not in schema:
            return self.convert(typing_members[0], ctx, key(path, "allOf"), depth)
        if "type" in schema:
            return self.typed(schema, ctx, path, depth)
        self.warn(key(path, "allOf"), "an allOf of several non-object schemas")
        return ANY

    def reference(self, ref: str, path: str, depth: int) -> PyType:
        if ref in self.ref_names:
            return PyType("ref", self.ref_names[ref])
        target = self.pointer(ref)
        if isinstance(target, dict) and _is_object(target) and target.get("properties"):
            segment = ref.rsplit("/", 1)[-1] if ref != "#" else ""
            ctx = pascal(segment) if segment else pascal(self.tool, "Arguments")
            properties, required, _ = self.object_parts(target, ref)
            return self.typed_dict(target, properties, required, ctx, ref, ref=ref)
        if ref in self.resolving:
            self.warn(path, f"the recursive non-object $ref {ref!r}")
            return ANY
        self.resolving.add(ref)
        try:
            return self.convert(target, pascal(ref.rsplit("/", 1)[-1]), path, depth)
        finally:
            self.resolving.discard(ref)

    def typed(self, schema: dict[str, Any], ctx: str, path: str, depth: int) -> PyType:
        declared = schema.get("type")
        if declared is None:
            if _is_object(schema):
                declared = "object"
            elif "items" in schema or "prefixItems" in schema:
                declared = "array"
            else:
                return ANY
        kinds = declared if isinstance(declared, list) else [declared]
        members: list[PyType] = []
        for kind in kinds:
            if kind == "object":
                members.append(self.object_type(schema, ctx, path, depth))
            elif kind == "array":
                members.append(self.array_type(schema, ctx, path, depth))
            else:
                members.append(_PRIMS.get(kind, ANY))
        return union(members)

    def object_type(self, schema: dict[str, Any], ctx: str, path: str, depth: int) -> PyType:
        properties = schema.get("properties")
        if properties:
            return self.typed_dict(
                schema, properties, list(schema.get("required") or []), ctx, path
            )
        extra = schema.get("additionalProperties", True)
        value = ANY
        if isinstance(extra, dict):
            value = self.convert(extra, ctx + "Value", key(path, "additionalProperties"), depth)
        return PyType("dict", args=(value,))

    def array_type(self, schema: dict[str, Any], ctx: str, path: str, depth: int) -> PyType:
        items = schema.get("items", True)
        prefix = schema.get("prefixItems")
        if prefix:
            where = key(path, "prefixItems")
            parts = [
                self.convert(p, f"{ctx}Item{i + 1}", index(where, i), depth)
                for i, p in enumerate(prefix)
            ]
            if items is False or schema.get("maxItems") == len(prefix):
                return PyType("tuple", args=tuple(parts))
            parts.append(self.convert(items, f"{ctx}Item", key(path, "items"), depth))
            return PyType("list", args=(union(parts),))
        item = self.convert(items, f"{ctx}Item", key(path, "items"), depth)
        if schema.get("x-tuple"):
            return PyType("tuple", args=(item,), variadic=True)
        return PyType("list", args=(item,))

    def typed_dict(
        self,
        schema: dict[str, Any],
        properties: dict[str, Any],
        required: list[str],
        ctx: str,
        path: str,
        ref: str | None = None,
    ) -> PyType:
        canonical = json.dumps(schema, sort_keys=True)
        share_key = (ctx, canonical if "$ref" not in canonical else f"{self.tool}\0{canonical}")
        if share_key in self.shared:
            name = self.shared[share_key]
            if ref is not None:
                self.ref_names[ref] = name
            return PyType("ref", name)
        name = self.unique(ctx)
        self.shared[share_key] = name
        if ref is not None:
            self.ref_names[ref] = name
        fields = self.fields(properties, required, name, key(path, "properties"), as_params=False)
        description = schema.get("description") or schema.get("title") or ""
        self.typed_dicts.append(TypedDictDef(name, str(description), tuple(fields)))
        return PyType("ref", name)


def _is_object(schema: dict[str, Any]) -> bool:
    declared = schema.get("type")
    if declared is None:
        return "properties" in schema or "additionalProperties" in schema
    return declared == "object" or (isinstance(declared, list) and declared == ["object"])


@dataclass(frozen=True)
class ToolInput:
    """What the planner needs of one tool."""

    tool: str
    name: str
    description: str
    input_schema: dict[str, Any]
    input_path: str
    output_schema: Any
    output_path: str


def plan_tools(
    tools: list[ToolInput], taken: set[str], *, mcp_content: bool = False
) -> tuple[Plan, list[str]]:
    """Plan every tool's stub; ``taken`` holds the module-level names TypedDicts must avoid.
    With ``mcp_content`` the MCP content TypedDicts (`stubs_gen.content`) come first, under their
    own names."""
    planner = _Planner(taken)
    if mcp_content:
        for name, schema in CONTENT_TYPES.items():
            planner.tool, planner.root = name, schema
            planner.typed_dict(schema, schema["properties"], schema["required"], name, "$")
    functions = [
        planner.function(
            t.tool,
            t.name,
            t.description,
            t.input_schema,
            t.output_schema,
            t.input_path,
            t.output_path,
        )
        for t in tools
    ]
    return Plan(tuple(functions), tuple(planner.typed_dicts)), planner.warnings
