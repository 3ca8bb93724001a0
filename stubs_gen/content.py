"""The typed content items of an MCP tool's answer, as the stub module documents them.

A tool whose ``x-ptc`` sets ``mcp_content`` (every tool `ptc mcp` forwards to an upstream MCP
server) may answer with more than JSON: images, audio, embedded resources, resource links. The
script then gets the list of the answer's content items, in order, each a plain JSON object (only
JSON crosses the sandbox boundary: binary data is base64 text under ``data``). When a manifest
has such a tool, the stub module and its compact form define these TypedDicts once, before the
tools' own types, so the model and the script see the exact shapes:

    McpText          {"type": "text", "text": str}
    McpImage         {"type": "image", "mime_type": str, "data": base64 str}
    McpAudio         {"type": "audio", "mime_type": str, "data": base64 str}
    McpResource      {"type": "resource", "uri": str, "mime_type": str | None,
                      "text": str}  or  ..., "data": base64 str}
    McpResourceLink  {"type": "resource_link", "uri": str, "name": str,
                      "mime_type": str | None, "description": str | None}
"""

from __future__ import annotations

from typing import Any

__all__ = ["CONTENT_TYPES"]

_KINDS = "McpText | McpImage | McpAudio | McpResource | McpResourceLink"
_NULLABLE_STR: dict[str, Any] = {"type": ["string", "null"]}


def _kind(value: str) -> dict[str, Any]:
    return {"const": value}


# TypedDict name -> its JSON Schema (planned like any tool's object type).
CONTENT_TYPES: dict[str, dict[str, Any]] = {
    "McpText": {
        "description": "Text of an MCP tool's answer. An answer with images, audio or resources "
        f"comes as a list of {_KINDS}, in the answer's order.",
        "type": "object",
        "properties": {"type": _kind("text"), "text": {"type": "string"}},
        "required": ["type", "text"],
    },
    "McpImage": {
        "description": "An image; data is base64: base64.b64decode(item['data']) is its bytes.",
        "type": "object",
        "properties": {
            "type": _kind("image"),
            "mime_type": {"type": "string"},
            "data": {"type": "string"},
        },
        "required": ["type", "mime_type", "data"],
    },
    "McpAudio": {
        "description": "Audio; data is base64.",
        "type": "object",
        "properties": {
            "type": _kind("audio"),
            "mime_type": {"type": "string"},
            "data": {"type": "string"},
        },
        "required": ["type", "mime_type", "data"],
    },
    "McpResource": {
        "description": "An embedded resource: its text, or its bytes as base64 in data.",
        "type": "object",
        "properties": {
            "type": _kind("resource"),
            "uri": {"type": "string"},
            "mime_type": _NULLABLE_STR,
            "text": {"type": "string"},
            "data": {"type": "string"},
        },
        "required": ["type", "uri", "mime_type"],
    },
    "McpResourceLink": {
        "description": "A link to a resource (not its content).",
        "type": "object",
        "properties": {
            "type": _kind("resource_link"),
            "uri": {"type": "string"},
            "name": {"type": "string"},
            "mime_type": _NULLABLE_STR,
            "description": _NULLABLE_STR,
        },
        "required": ["type", "uri", "name", "mime_type", "description"],
    },
}
