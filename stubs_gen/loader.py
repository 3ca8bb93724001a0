"""`load_manifest`: JSON (text or parsed) in any mix of dialects -> a checked `Manifest`.

The pipeline, each step in its own module: `dialects` finds the tool list and reads each
envelope; `names` gives each tool its Python name (collisions and reserved names are errors);
`schema` normalises the schemas to standard JSON Schema; `options` reads ``x-ptc``; `types`
plans the typed signatures. Anything wrong is a `ManifestError` naming tool and JSON path.

The manifest hash is the SHA-256 of the tool array's canonical JSON: keys sorted, compact
separators, ASCII escapes, so the same tools hash the same whatever their formatting.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from stubs_gen.content import CONTENT_TYPES
from stubs_gen.dialects import parse_source, read_tool
from stubs_gen.errors import ManifestError
from stubs_gen.model import Manifest, ToolSpec
from stubs_gen.names import MODULE_RESERVED, collision, python_name
from stubs_gen.options import read_options
from stubs_gen.schema import normalise_input, normalise_output
from stubs_gen.types import ToolInput, plan_tools

__all__ = ["load_manifest"]


def load_manifest(
    source: str | bytes | list[Any] | dict[str, Any], *, origin: str = "manifest"
) -> Manifest:
    """Load and check a manifest; raises `ManifestError` (only) on bad input."""
    try:
        return _load(source, origin)
    except RecursionError:
        raise ManifestError(f"{origin} is nested too deeply") from None


def _load(source: str | bytes | list[Any] | dict[str, Any], origin: str) -> Manifest:
    entries, base = parse_source(source, origin)
    canonical = json.dumps(entries, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode("ascii")).hexdigest()
    warnings: list[str] = []
    by_python: dict[str, str] = {}
    seen: set[str] = set()
    inputs: list[ToolInput] = []
    staged: list[tuple[str, str, str, dict[str, Any], Any, Any]] = []
    for position, entry in enumerate(entries):
        path = f"{base}[{position}]"
        raw = read_tool(entry, path, f"tools[{position}]")
        name = raw.name
        if name in seen:
            raise ManifestError("duplicate tool name", tool=name, path=path)
        seen.add(name)
        ident = python_name(name)
        if ident in by_python:
            raise ManifestError(
                collision("tools", by_python[ident], name, ident),
                tool=name,
                path=path,
            )
        if ident in MODULE_RESERVED or (ident.startswith("__") and ident.endswith("__")):
            raise ManifestError(
                f"the Python name {ident!r} is reserved by the stub module", tool=name, path=path
            )
        by_python[ident] = name
        input_schema, found = normalise_input(raw.input_schema, name, raw.input_path)
        warnings += found
        output_schema: Any = None
        if isinstance(raw.output_schema, dict):
            output_schema, found = normalise_output(raw.output_schema, name, raw.output_path)
            warnings += found
        elif raw.output_schema is not None and not isinstance(raw.output_schema, bool):
            raise ManifestError(
                "invalid schema: the output schema must be an object",
                tool=name,
                path=raw.output_path,
            )
        options = read_options(raw.options, raw.annotations, name, raw.options_path)
        inputs.append(
            ToolInput(
                name,
                ident,
                raw.description,
                input_schema,
                raw.input_path,
                output_schema,
                raw.output_path,
            )
        )
        staged.append((name, ident, raw.description, input_schema, output_schema, options))
    mcp_content = any(staged_options.mcp_content for *_, staged_options in staged)
    for ident in sorted(set(CONTENT_TYPES) & set(by_python)) if mcp_content else ():
        raise ManifestError(
            f"the Python name {ident!r} is reserved by the stub module (a tool with "
            "x-ptc.mcp_content defines it)",
            tool=by_python[ident],
            path=base,
        )
    plan, found = plan_tools(inputs, set(by_python), mcp_content=mcp_content)
    warnings += found
    tools = tuple(
        ToolSpec(
            name=name,
            python_name=ident,
            description=description,
            input_schema=input_schema,
            output_schema=output_schema,
            options=options,
            param_names={p.ident: p.key for p in function.params},
        )
        for (name, ident, description, input_schema, output_schema, options), function in zip(
            staged, plan.functions, strict=True
        )
    )
    return Manifest(tools=tools, warnings=tuple(warnings), sha256=digest, _plan=plan)
