"""Schema dialects: any tool's JSON Schema, normalised to standard JSON Schema (draft 2020-12).

What this module owns:

- BFCL's dialect mapped onto standard JSON Schema: ``"dict"`` -> ``"object"``, ``"float"`` ->
  ``"number"`` (which accepts integers), ``"tuple"`` -> ``"array"``, ``"any"`` -> no constraint; the
  ``"optional"`` key (on a property: ``true``/``"True"``; on an object: a list of names) takes the
  property out of ``required``; a property-level ``"required": true`` (OpenAPI style) puts it in.
- Older drafts and OpenAPI: array-form ``items`` -> ``prefixItems``, boolean
  ``exclusiveMinimum``/``exclusiveMaximum``, ``dependencies``, ``nullable: true``.
- A structural check of every keyword whose value type JSON Schema fixes (``"type": 5`` or
  ``"properties": []`` are `ManifestError`s naming tool and JSON path). It replaces
  ``check_schema`` at load time, which costs ~0.7 ms a tool; the tests cross-check that whatever
  passes here also passes ``Draft202012Validator.check_schema``.
- Constructs that are valid but unsupported (remote or anchor ``$ref``) are dropped with a warning,
  so that the validator never tries to fetch anything.
- A common mistake of published manifests, an ``enum`` of item values written at an array's level
  (``{"type": "array", "items": {"type": "string"}, "enum": ["view", "edit"]}``, which no array
  could ever match), is read as the items' ``enum``, with a warning naming tool and path. When
  the items have an ``enum`` or ``const`` of their own, that one stands and the array's is
  dropped, with the same warning.

Defaults are kept as annotations and never validated (jsonschema ignores them).
"""

from __future__ import annotations

import math
import re
from typing import Any

from stubs_gen.errors import ManifestError
from stubs_gen.jsonpath import index, key

__all__ = ["normalise_input", "normalise_output"]

MAX_DEPTH = 64

_TYPE_ALIASES: dict[str, str | None] = {
    "string": "string",
    "integer": "integer",
    "number": "number",
    "boolean": "boolean",
    "object": "object",
    "array": "array",
    "null": "null",
    # BFCL and Python-flavoured spellings
    "dict": "object",
    "float": "number",
    "tuple": "array",
    "any": None,
    "int": "integer",
    "str": "string",
    "bool": "boolean",
    "list": "array",
}
_SCHEMA_VALUED = (
    "additionalProperties",
    "unevaluatedProperties",
    "unevaluatedItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
)
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_NUMBERS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_COUNTS = (
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
)
_STRINGS = ("format", "title", "description", "$comment", "contentMediaType", "contentEncoding")
_DROPPED = (
    "$schema",
    "$id",
    "$anchor",
    "$dynamicAnchor",
    "$dynamicRef",
    "$recursiveRef",
    "$recursiveAnchor",
    "$vocabulary",
    "optional",
    "nullable",
    "additionalItems",
    "dependencies",
)


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1")
    return bool(value)


class _Normaliser:
    def __init__(self, tool: str) -> None:
        self.tool = tool
        self.warnings: list[str] = []
        self.refs: list[tuple[str, str]] = []

    def fail(self, reason: str, path: str) -> ManifestError:
        return ManifestError(f"invalid schema: {reason}", tool=self.tool, path=path)

    def schema(self, node: Any, path: str, depth: int) -> Any:
        if isinstance(node, bool):
            return node
        if not isinstance(node, dict):
            raise self.fail("a schema must be an object or a boolean", path)
        if depth > MAX_DEPTH:
            raise self.fail(f"nested more than {MAX_DEPTH} levels deep", path)
        out: dict[str, Any] = {}
        sub = depth + 1
        for name, value in node.items():
            where = key(path, name)
            if name == "type":
                mapped = self.type(value, where)
                if mapped is not None:
                    out["type"] = mapped
                if value == "tuple":
                    out["x-tuple"] = True  # annotation read by types.py: render tuple[T, ...]
            elif name == "properties":
                out[name] = self.properties(value, where, sub)
            elif name == "required":
                if isinstance(value, bool):
                    continue  # property-level flag: read by the parent in `properties`
                out[name] = self.required(value, where)
            elif name == "items":
                if isinstance(value, list):
                    if value:  # draft 4 tuple form; an empty one constrains nothing
                        out["prefixItems"] = self.schema_list(value, where, sub)
                    extra = node.get("additionalItems", True)
                    if extra is not True:
                        out["items"] = self.schema(extra, key(path, "additionalItems"), sub)
                else:
                    out[name] = self.schema(value, where, sub)
            elif name in _SCHEMA_VALUED:
                out[name] = self.schema(value, where, sub)
            elif name in _SCHEMA_MAPS:
                if not isinstance(value, dict):
                    raise self.fail(f"'{name}' must be an object", where)
                if name == "patternProperties":
                    for pattern in value:
                        self.pattern(pattern, key(where, pattern))
                out[name] = {k: self.schema(v, key(where, k), sub) for k, v in value.items()}
            elif name in _SCHEMA_LISTS:
                out[name] = self.schema_list(value, where, sub)
            elif name == "enum":
                if not isinstance(value, list):
                    raise self.fail("'enum' must be an array", where)
                out[name] = value
            elif name in _NUMBERS:
                self.number(name, value, out, where)
            elif name in _COUNTS:
                if isinstance(value, bool) or not (
                    (isinstance(value, int) and value >= 0)
                    or (isinstance(value, float) and value.is_integer() and value >= 0)
                ):
                    raise self.fail(f"'{name}' must be a non-negative integer", where)
                out[name] = value
            elif name == "uniqueItems":
                if not isinstance(value, bool):
                    raise self.fail("'uniqueItems' must be a boolean", where)
                out[name] = value
            elif name == "pattern":
                self.pattern(value, where)
                out[name] = value
            elif name in _STRINGS:
                if not isinstance(value, str):
                    raise self.fail(f"'{name}' must be a string", where)
                out[name] = value
            elif name == "$ref":
                self.ref(value, where, out)
            elif name == "dependentRequired":
                out[name] = self.dependent_required(value, where)
            elif name == "dependencies":
                self.dependencies(value, where, out, sub)
            elif name not in _DROPPED:
                out[name] = value  # const, default, examples, unknown annotations: kept as is
        if node.get("nullable") is True and "type" in out:
            types = out["type"] if isinstance(out["type"], list) else [out["type"]]
            if "null" not in types:
                out["type"] = [*types, "null"]
        for flag, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if node.get(flag) is True and bound in out:
                out[flag] = out.pop(bound)
        if isinstance(node.get("properties"), dict):
            self.requiredness(node, out)
        if out.get("type") == "array" and _item_values(out.get("enum")):
            self.array_enum(out, path)
        return out

    def array_enum(self, out: dict[str, Any], path: str) -> None:
        """An array's ``enum`` of item values (an array can never equal one): the items'."""
        items = out.get("items", True)
        if "prefixItems" in out or not (items is True or isinstance(items, dict)):
            return  # a tuple, or no items allowed: no reading is safer than the schema's own
        values = out.pop("enum")
        if isinstance(items, dict) and ("enum" in items or "const" in items):
            reading = "dropped: the items' own enum stands"
        else:
            out["items"] = {**(items if isinstance(items, dict) else {}), "enum": values}
            reading = "read as the enum of its items"
        self.warnings.append(
            f"tool {self.tool!r} at {key(path, 'enum')}: an array's 'enum' lists item values, "
            f"which no array matches; {reading}"
        )

    def requiredness(self, node: dict[str, Any], out: dict[str, Any]) -> None:
        """Apply BFCL's ``optional`` and OpenAPI's property-level ``required: true``."""
        names: list[str] = list(out.get("required", []))
        optional: set[str] = set()
        if isinstance(node.get("optional"), list):
            optional.update(n for n in node["optional"] if isinstance(n, str))
        for name, prop in node["properties"].items():
            if not isinstance(prop, dict):
                continue
            if prop.get("required") is True and name not in names:
                names.append(name)
            flag = prop.get("optional")
            if flag is not None and not isinstance(flag, list) and _truthy(flag):
                optional.add(name)
        names = [n for n in names if n not in optional]
        if names:
            out["required"] = names
        else:
            out.pop("required", None)

    def type(self, value: Any, path: str) -> Any:
        if isinstance(value, str):
            if value not in _TYPE_ALIASES:
                raise self.fail(f"unknown type {value!r}", path)
            return _TYPE_ALIASES[value]
        if isinstance(value, list) and value:
            mapped: list[str] = []
            for position, item in enumerate(value):
                if not isinstance(item, str) or item not in _TYPE_ALIASES:
                    raise self.fail(f"unknown type {item!r}", index(path, position))
                alias = _TYPE_ALIASES[item]
                if alias is None:
                    return None
                if alias not in mapped:
                    mapped.append(alias)
            return mapped if len(mapped) > 1 else mapped[0]
        raise self.fail("'type' must be a type name or a non-empty array of them", path)

    def properties(self, value: Any, path: str, depth: int) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail("'properties' must be an object", path)
        return {name: self.schema(prop, key(path, name), depth) for name, prop in value.items()}

    def required(self, value: Any, path: str) -> list[str]:
        if not isinstance(value, list):
            raise self.fail("'required' must be an array of property names", path)
        names: list[str] = []
        for position, item in enumerate(value):
            if not isinstance(item, str):
                raise self.fail("'required' must hold strings", index(path, position))
            if item not in names:
                names.append(item)
        return names

    def schema_list(self, value: Any, path: str, depth: int) -> list[Any]:
        if not isinstance(value, list) or not value:
            raise self.fail("must be a non-empty array of schemas", path)
        return [self.schema(item, index(path, i), depth) for i, item in enumerate(value)]

    def number(self, name: str, value: Any, out: dict[str, Any], path: str) -> None:
        if isinstance(value, bool) and name in ("exclusiveMinimum", "exclusiveMaximum"):
            return  # draft 4 flag: applied to minimum/maximum once the node is read
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise self.fail(f"'{name}' must be a number", path)
        if name == "multipleOf" and value <= 0:
            raise self.fail("'multipleOf' must be greater than 0", path)
        out[name] = value

    def pattern(self, value: Any, path: str) -> None:
        if not isinstance(value, str):
            raise self.fail("'pattern' must be a string", path)
        try:
            re.compile(value)
        except (re.error, RecursionError, OverflowError) as exc:
            raise self.fail(f"bad regular expression: {exc}", path) from None

    def ref(self, value: Any, path: str, out: dict[str, Any]) -> None:
        if not isinstance(value, str):
            raise self.fail("'$ref' must be a string", path)
        if value == "#" or value.startswith("#/"):
            out["$ref"] = value
            self.refs.append((value, path))
        else:
            self.warnings.append(
                f"tool {self.tool!r} at {path}: $ref {value!r} is not a local JSON pointer; "
                "degraded to Any"
            )

    def dependent_required(self, value: Any, path: str) -> dict[str, list[str]]:
        if not isinstance(value, dict):
            raise self.fail("'dependentRequired' must be an object", path)
        out: dict[str, list[str]] = {}
        for name, names in value.items():
            out[name] = self.required(names, key(path, name))
        return out

    def dependencies(self, value: Any, path: str, out: dict[str, Any], depth: int) -> None:
        if not isinstance(value, dict):
            raise self.fail("'dependencies' must be an object", path)
        for name, dep in value.items():
            where = key(path, name)
            if isinstance(dep, list):
                out.setdefault("dependentRequired", {})[name] = self.required(dep, where)
            else:
                out.setdefault("dependentSchemas", {})[name] = self.schema(dep, where, depth)


def _item_values(enum: Any) -> bool:
    """Whether ``enum`` is a non-empty list of which no value is an array."""
    return isinstance(enum, list) and bool(enum) and not any(isinstance(v, list) for v in enum)


def _resolve(root: Any, pointer: str) -> Any:
    node = root
    if pointer == "#":
        return node
    for raw in pointer[2:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise LookupError(pointer)
    return node


def _run(node: Any, tool: str, path: str) -> tuple[Any, list[str]]:
    norm = _Normaliser(tool)
    try:
        out = norm.schema(node, path, 0)
    except RecursionError:
        raise ManifestError("invalid schema: nested too deeply", tool=tool, path=path) from None
    for ref, where in norm.refs:
        try:
            _resolve(out, ref)
        except LookupError:
            raise ManifestError(
                f"invalid schema: $ref {ref!r} does not resolve", tool=tool, path=where
            ) from None
    return out, norm.warnings


def normalise_input(node: Any, tool: str, path: str) -> tuple[dict[str, Any], list[str]]:
    """The tool's parameter schema as a standard object schema, plus warnings."""
    if node is None:
        return {"type": "object", "properties": {}}, []
    out, warnings = _run(node, tool, path)
    if out is True:
        out = {"type": "object"}
    if not isinstance(out, dict):
        raise ManifestError("the parameters schema must be an object schema", tool=tool, path=path)
    declared = out.get("type")
    if declared is None:
        if "$ref" not in out and "allOf" not in out:
            out["type"] = "object"
    elif declared != "object" and not (isinstance(declared, list) and "object" in declared):
        raise ManifestError(
            f"the parameters schema must have type 'object', not {declared!r}", tool=tool, path=path
        )
    return out, warnings


def normalise_output(node: Any, tool: str, path: str) -> tuple[Any, list[str]]:
    """The tool's result schema (any type), plus warnings."""
    out, warnings = _run(node, tool, path)
    return out, warnings
