"""Argument validation: a call's arguments checked against the tool's normalised JSON Schema.

Uses ``jsonschema``'s Draft 2020-12 validator (the schema was normalised by `schema.py`, so BFCL's
``float`` is ``number`` and accepts integers, and ``optional`` is already folded into
``required``). Formats are not asserted, defaults are never validated. Arguments the stub cannot
pass (names the schema does not declare) are rejected unless the schema itself allows extra
properties at the top level. Messages name the argument by its JSON path inside the arguments
and say what was expected: ``argument 'city': expected string, got 42``.

The broker validates every call, so the common shape gets a fast path: a flat object whose
properties are only typed scalars (most real tools) is checked by a few `isinstance` calls with
the Draft 2020-12 type semantics (``integer`` includes ``1.0``, ``number`` excludes booleans).
The fast path only ever *accepts*: anything it does not accept goes to ``jsonschema``, which
decides and writes the messages, so both paths agree by construction.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

__all__ = ["ArgumentValidator"]

_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
_MAX_MESSAGES = 20


def _show(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _where(error: ValidationError) -> str:
    path = ""
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _expected_type(error: ValidationError) -> str:
    expected = error.validator_value
    if isinstance(expected, list):
        return " or ".join(str(t) for t in expected)
    return str(expected)


def _message(error: ValidationError) -> str:
    where = _where(error)
    kind = error.validator
    if kind == "required" and isinstance(error.instance, dict):
        names: Any = error.validator_value
        missing = [n for n in names if n not in error.instance]
        name = missing[0] if missing else "?"
        if not where:
            return f"missing required argument {name!r}"
        return f"argument {where!r}: missing required key {name!r}"
    if kind == "additionalProperties" and isinstance(error.instance, dict):
        allowed = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        extra = sorted(k for k in error.instance if k not in allowed)
        if not where:
            return (
                "unexpected argument"
                + ("s " if len(extra) > 1 else " ")
                + ", ".join(repr(e) for e in extra)
            )
        return f"argument {where!r}: unexpected key(s) " + ", ".join(repr(e) for e in extra)
    label = f"argument {where!r}" if where else "arguments"
    if kind == "type":
        return f"{label}: expected {_expected_type(error)}, got {_show(error.instance)}"
    if kind == "enum":
        values: Any = error.validator_value
        allowed_values = ", ".join(_show(v) for v in values)
        return f"{label}: expected one of {allowed_values}, got {_show(error.instance)}"
    if kind == "const":
        return f"{label}: expected {_show(error.validator_value)}, got {_show(error.instance)}"
    return f"{label}: {error.message}"


def _is_integer(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


_SCALAR_CHECKS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": _is_integer,
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}
_ANNOTATIONS = frozenset({"description", "title", "default", "examples", "deprecated"})
_FAST_OBJECT_KEYS = _ANNOTATIONS | {"type", "properties", "required", "additionalProperties"}


def _scalar_check(schema: Any) -> Callable[[Any], bool] | None:
    """The check of a property schema that is only a scalar type (or a list of them)."""
    if not isinstance(schema, dict) or not set(schema) <= _ANNOTATIONS | {"type"}:
        return None
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    checks = [_SCALAR_CHECKS.get(k) if isinstance(k, str) else None for k in kinds]
    if not checks or None in checks:
        return None
    if len(checks) == 1:
        return checks[0]
    return lambda v: any(check(v) for check in checks)  # type: ignore[misc]


def _fast_accept(schema: dict[str, Any]) -> Callable[[dict[str, Any]], bool] | None:
    """An accept-only check for a flat object of typed scalars, or None for other shapes."""
    if not set(schema) <= _FAST_OBJECT_KEYS or schema.get("type") != "object":
        return None
    if schema.get("additionalProperties", False) is not False:
        return None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    if not isinstance(properties, dict) or not isinstance(required, list):
        return None
    checks: dict[str, Callable[[Any], bool]] = {}
    for name, sub in properties.items():
        check = _scalar_check(sub)
        if check is None:
            return None
        checks[name] = check
    needed = tuple(required)

    def accept(arguments: dict[str, Any]) -> bool:
        for name in needed:
            if name not in arguments:
                return False
        for name, value in arguments.items():
            check = checks.get(name)
            if check is None or not check(value):
                return False
        return True

    return accept


class ArgumentValidator:
    """A compiled validator for one tool's arguments."""

    def __init__(self, input_schema: dict[str, Any]) -> None:
        schema = dict(input_schema)
        if not any(k in schema for k in _OPEN_KEYS) and isinstance(schema.get("properties"), dict):
            schema["additionalProperties"] = False
        self._validator = Draft202012Validator(schema)
        self._fast = _fast_accept(schema)

    def check(self, arguments: Any) -> list[str]:
        """Problems with ``arguments``, sorted by path; ``[]`` when they are valid."""
        if not isinstance(arguments, dict):
            return [f"arguments: expected object, got {_show(arguments)}"]
        if self._fast is not None and self._fast(arguments):
            return []
        try:
            errors = list(self._validator.iter_errors(arguments))
        except RecursionError:
            return ["arguments: nested too deeply to validate"]
        messages = sorted({_message(e) for e in errors})
        if len(messages) > _MAX_MESSAGES:
            dropped = len(messages) - _MAX_MESSAGES
            messages = [*messages[:_MAX_MESSAGES], f"... and {dropped} more problems"]
        return messages
