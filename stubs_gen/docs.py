"""Docstring text for stubs and TypedDicts, in a full form (the module) and a lean one (compact).

The full form documents every argument (description, allowed values, default, constraints, the
original name when it is not a Python identifier) and what the tool returns. The compact form
writes a line only where there is something to say beyond the parameter's name, type and
default, which the signature already shows.
"""

from __future__ import annotations

from typing import Any

from stubs_gen.names import is_identifier
from stubs_gen.types import Field, Function, TypedDictDef

__all__ = ["function_doc", "literal", "typed_dict_doc"]

_BOUNDS = (
    ("minimum", ">="),
    ("exclusiveMinimum", ">"),
    ("maximum", "<="),
    ("exclusiveMaximum", "<"),
)


def clean(text: str) -> str:
    """Description text with line endings, trailing blanks and blank-line runs normalised."""
    lines = [line.rstrip() for line in text.strip().replace("\r\n", "\n").split("\n")]
    out: list[str] = []
    for line in lines:
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out)


def literal(value: Any) -> str:
    """A JSON value as the Python literal a script would write."""
    return repr(value)


def constraints(schema: Any) -> list[str]:
    """Short notes for the validation keywords a Python type cannot show."""
    if not isinstance(schema, dict):
        return []
    notes = [f"{op} {literal(schema[name])}" for name, op in _BOUNDS if name in schema]
    if "multipleOf" in schema:
        notes.append(f"multiple of {literal(schema['multipleOf'])}")
    for low, high, what in (
        ("minLength", "maxLength", "chars"),
        ("minItems", "maxItems", "items"),
        ("minProperties", "maxProperties", "keys"),
    ):
        if low in schema or high in schema:
            lo: Any = schema.get(low)
            hi: Any = schema.get(high)
            if lo is not None and hi is not None:
                notes.append(f"{int(lo)}..{int(hi)} {what}")
            elif lo is not None:
                notes.append(f">= {int(lo)} {what}")
            else:
                notes.append(f"<= {int(hi)} {what}")
    if schema.get("uniqueItems"):
        notes.append("unique items")
    if "pattern" in schema:
        notes.append(f"pattern {literal(schema['pattern'])}")
    if "format" in schema:
        notes.append(f"format {schema['format']}")
    return notes


def _allowed(schema: Any) -> list[Any] | None:
    if not isinstance(schema, dict):
        return None
    if "enum" in schema and isinstance(schema["enum"], list):
        return list(schema["enum"])
    if "const" in schema:
        return [schema["const"]]
    return None


def _description(schema: Any) -> str:
    if isinstance(schema, dict):
        text = schema.get("description") or schema.get("title") or ""
        return clean(text) if isinstance(text, str) else ""
    return ""


def _sentence(text: str) -> str:
    return text if not text or text[-1] in ".!?:;)" else text + "."


def field_line(field: Field, *, full: bool, in_signature: bool) -> str | None:
    """The docstring line for one argument or key, or None when the compact form needs none."""
    schema = field.schema
    parts = [_sentence(_description(schema))] if _description(schema) else []
    allowed = _allowed(schema)
    if allowed is not None and (full or not _literal_shown(allowed)):
        parts.append("Allowed: " + ", ".join(literal(v) for v in allowed) + ".")
    has_default = isinstance(schema, dict) and "default" in schema
    if has_default and (full or not in_signature):
        parts.append(f"Default: {literal(schema['default'])}.")
    notes = constraints(schema)
    if notes:
        note = "; ".join(notes)
        parts.append(note[0].upper() + note[1:] + ".")
    if field.ident != field.key:
        parts.append(f"Sent as {field.key!r}.")
    if full and not field.required and not has_default:
        parts.append("Optional.")
    if not parts:
        return None
    label = field.ident if is_identifier(field.ident) else repr(field.key)
    text = _indent(" ".join(parts), "    ")
    return f"{label}: {text}"


def _literal_shown(values: list[Any]) -> bool:
    return all(v is None or isinstance(v, str | int | bool) for v in values)


def _indent(text: str, prefix: str) -> str:
    """Continuation lines indented by ``prefix``; blank lines stay empty."""
    return "\n".join(
        [line if i == 0 or not line else prefix + line for i, line in enumerate(text.split("\n"))]
    )


def function_doc(function: Function, *, full: bool, indent: str) -> str | None:
    """The stub's docstring (without quotes), continuation lines indented by ``indent``."""
    lines: list[str] = []
    description = clean(function.description)
    if description:
        lines.append(description)
    args = [
        line
        for field in function.params
        if (line := field_line(field, full=full, in_signature=not field.required)) is not None
    ]
    returns = _description(function.returns_schema)
    if full:
        if lines:
            lines.append("")
        if args:
            lines.append("Args:")
            lines += ["    " + _indent(a, "    ") for a in args]
            lines.append("")
        lines.append("Returns:")
        lines.append("    " + (_indent(returns, "    ") if returns else "The tool's result."))
    else:
        lines += args
        if returns:
            lines.append(f"Returns: {returns}")
    if not lines:
        return None
    return _indent("\n".join(lines), indent)


def typed_dict_doc(typed_dict: TypedDictDef, *, full: bool, indent: str) -> str | None:
    """The TypedDict's docstring: its description and one line per documented key."""
    lines: list[str] = []
    description = clean(typed_dict.description)
    if description:
        lines.append(description)
    keys = [
        line
        for field in typed_dict.fields
        if (line := field_line(field, full=full, in_signature=False)) is not None
    ]
    if full and keys and lines:
        lines.append("")
    lines += keys
    if not lines:
        return None
    return _indent("\n".join(lines), indent)
