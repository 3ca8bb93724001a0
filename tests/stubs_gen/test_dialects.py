"""Dialects mixed in one manifest, ``x-ptc`` options and the manifest hash."""

from __future__ import annotations

import json

from stubs_gen import ToolOptions, load_manifest

SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
MIXED = {
    "tools": [
        {
            "type": "function",
            "function": {"name": "openai", "description": "o", "parameters": SCHEMA},
        },
        {"name": "flat", "description": "f", "parameters": SCHEMA},
        {"name": "anthropic", "description": "a", "input_schema": SCHEMA},
        {
            "name": "mcp",
            "title": "MCP tool",
            "description": "m",
            "inputSchema": SCHEMA,
            "outputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}},
            "annotations": {"readOnlyHint": True},
        },
        {
            "name": "bfcl.tool",
            "description": "b",
            "parameters": {
                "type": "dict",
                "properties": {"q": {"type": "string"}},
                "required": ["q"],
            },
        },
        {
            "name": "opts",
            "x-ptc": {
                "mode": "mock",
                "mock": {"ok": True},
                "needs_approval": True,
                "summary_fields": ["ok"],
                "returns": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
            },
        },
        {
            "name": "hosted",
            "x-ptc": {"mode": "host", "handler": "pkg.mod:func", "read_only": False},
        },
    ]
}


def test_mixed_dialects_load_to_one_model() -> None:
    manifest = load_manifest(MIXED)
    assert [t.name for t in manifest.tools] == [
        "openai",
        "flat",
        "anthropic",
        "mcp",
        "bfcl.tool",
        "opts",
        "hosted",
    ]
    for name in ("openai", "flat", "anthropic", "mcp", "bfcl.tool"):
        spec = manifest.tool(name)
        assert spec is not None
        assert spec.input_schema == SCHEMA
        assert spec.param_names == {"q": "q"}
    assert manifest.names["bfcl_tool"] == "bfcl.tool"
    mcp = manifest.tool("mcp")
    assert mcp is not None and mcp.options.read_only and mcp.output_schema is not None


def test_x_ptc_options() -> None:
    manifest = load_manifest(MIXED)
    opts, hosted, flat = manifest.tool("opts"), manifest.tool("hosted"), manifest.tool("flat")
    assert opts is not None and hosted is not None and flat is not None
    assert opts.options == ToolOptions(
        mode="mock", needs_approval=True, has_mock=True, mock={"ok": True}, summary_fields=("ok",)
    )
    assert opts.output_schema == {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    assert opts.input_schema == {"type": "object", "properties": {}}
    assert hosted.options.mode == "host" and hosted.options.handler == "pkg.mod:func"
    assert flat.options == ToolOptions()


def test_hash_is_canonical() -> None:
    text = json.dumps(MIXED["tools"], indent=4)
    reordered = json.dumps(list(MIXED["tools"]), sort_keys=True)
    assert (
        load_manifest(text).sha256 == load_manifest(reordered).sha256 == load_manifest(MIXED).sha256
    )
    assert load_manifest(text.encode()).sha256 == load_manifest(text).sha256
