"""Manifest dialects: find the tool list and read each tool definition's envelope.

Accepted, mixed freely in one manifest (DESIGN.md, "Manifest"):

- OpenAI chat: ``{"type": "function", "function": {"name", "description", "parameters"}}``
- flat / OpenAI responses / BFCL: ``{"name", "description", "parameters"}``
- Anthropic: ``{"name", "description", "input_schema"}``
- MCP: ``{"name", "title", "description", "inputSchema", "outputSchema", "annotations"}``

The schema dialect (BFCL's ``"dict"``, ``"float"``, ...) is independent of the envelope and is
handled by `schema.py`. This module only decides which keys hold what, and rejects what it
does not recognise with a `ManifestError` naming the tool and JSON path.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from stubs_gen.errors import ManifestError
from stubs_gen.jsonpath import key

__all__ = ["RawTool", "parse_source", "read_tool"]

_SCHEMA_KEYS = ("parameters", "input_schema", "inputSchema")
_ENVELOPE_TYPES = (None, "function", "custom")


@dataclass(frozen=True)
class RawTool:
    """One tool definition with its envelope removed; schemas still in their original dialect."""

    name: str
    description: str
    input_schema: Any  # None when the tool declares no parameters
    input_path: str
    output_schema: Any
    output_path: str
    annotations: dict[str, Any]
    options: dict[str, Any]
    options_path: str


def _reject_constant(value: str) -> Any:
    raise ValueError(f"{value} is not valid JSON")


def _check_json(value: Any, depth: int = 0) -> None:
    """Reject already-parsed input that JSON could not have produced (NaN, tuples, int keys...)."""
    if depth > 200:
        raise ManifestError("nested more than 200 levels deep")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ManifestError(f"object key {key!r} is not a string")
            _check_json(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_json(item, depth + 1)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ManifestError(f"{value} is not a JSON number")
    elif value is not None and not isinstance(value, str | int | bool):
        raise ManifestError(f"{type(value).__name__} is not a JSON value")


def parse_source(
    source: str | bytes | list[Any] | dict[str, Any], origin: str
) -> tuple[list[Any], str]:
    """The tool definitions in ``source`` (JSON text or parsed JSON) and their array's JSON path."""
    if isinstance(source, str | bytes | bytearray):
        try:
            data = json.loads(source, parse_constant=_reject_constant)
        except RecursionError:
            raise ManifestError(f"{origin} is nested too deeply") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"{origin} is not valid JSON: {exc}") from None
    elif isinstance(source, list | dict):
        data = source
        _check_json(data)
    else:
        raise ManifestError(
            f"{origin} must be JSON text, a list or a dict, not {type(source).__name__}"
        )
    if isinstance(data, dict):
        if "tools" not in data:
            raise ManifestError(f"{origin} is an object without a 'tools' array")
        data = data["tools"]
        if not isinstance(data, list):
            raise ManifestError("'tools' must be an array of tool definitions", path="$.tools")
        return data, "$.tools"
    elif not isinstance(data, list):
        raise ManifestError(
            f"{origin} must be an array of tool definitions or an object with a 'tools' array"
        )
    return data, "$"


def _text(value: Any, tool: str, path: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ManifestError("must be a string", tool=tool, path=path)
    return value


def read_tool(entry: Any, path: str, label: str) -> RawTool:
    """Read the envelope of one tool definition found at JSON ``path``."""
    if not isinstance(entry, dict):
        raise ManifestError("a tool definition must be an object", tool=label, path=path)
    body, body_path = entry, path
    outer_options = entry.get("x-ptc")
    if "function" in entry:
        # OpenAI chat: everything of interest sits under "function".
        if entry.get("type", "function") != "function":
            raise ManifestError(
                f"unknown dialect: 'type' is {entry.get('type')!r} next to 'function'",
                tool=label,
                path=f"{path}.type",
            )
        body, body_path = entry["function"], f"{path}.function"
        if not isinstance(body, dict):
            raise ManifestError("'function' must be an object", tool=label, path=body_path)
    elif entry.get("type") not in _ENVELOPE_TYPES:
        raise ManifestError(
            f"unknown dialect: tool type {entry.get('type')!r} is not 'function'",
            tool=str(entry.get("name", label)),
            path=f"{path}.type",
        )
    present = [key for key in _SCHEMA_KEYS if key in body]
    if "name" not in body:
        if not present:
            raise ManifestError(
                "unknown dialect: expected an OpenAI, Anthropic, MCP or BFCL tool definition "
                "(keys 'function', 'name', 'parameters', 'input_schema' or 'inputSchema')",
                tool=label,
                path=path,
            )
        raise ManifestError("tool has no 'name'", tool=label, path=body_path)
    name = body["name"]
    if not isinstance(name, str) or not name:
        raise ManifestError(
            "'name' must be a non-empty string", tool=label, path=f"{body_path}.name"
        )
    if len(present) > 1:
        raise ManifestError(
            f"ambiguous dialect: both {present[0]!r} and {present[1]!r} are present",
            tool=name,
            path=body_path,
        )
    schema_key = present[0] if present else None
    input_schema = body.get(schema_key) if schema_key else None
    description = _text(body.get("description"), name, f"{body_path}.description")
    annotations = body.get("annotations")
    if annotations is None:
        annotations = {}
    elif not isinstance(annotations, dict):
        raise ManifestError(
            "'annotations' must be an object", tool=name, path=f"{body_path}.annotations"
        )
    inner_options = body.get("x-ptc") if body is not entry else None
    if outer_options is not None and inner_options is not None:
        raise ManifestError(
            "'x-ptc' given both outside and inside 'function'", tool=name, path=key(path, "x-ptc")
        )
    options = outer_options if outer_options is not None else inner_options
    options_path = key(path, "x-ptc") if outer_options is not None else key(body_path, "x-ptc")
    if options is None:
        options = {}
    elif not isinstance(options, dict):
        raise ManifestError("'x-ptc' must be an object", tool=name, path=options_path)
    output_schema: Any = None
    output_path = f"{body_path}.outputSchema"
    if "returns" in options:
        output_schema, output_path = options["returns"], key(options_path, "returns")
    elif body.get("outputSchema") is not None:
        output_schema = body["outputSchema"]
    return RawTool(
        name=name,
        description=description,
        input_schema=input_schema,
        input_path=f"{body_path}.{schema_key}" if schema_key else f"{body_path}.parameters",
        output_schema=output_schema,
        output_path=output_path,
        annotations=annotations,
        options=options,
        options_path=options_path,
    )
