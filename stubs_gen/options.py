"""Per-tool ``x-ptc`` options: read and checked into a `ToolOptions`.

Unknown keys are errors (a misspelt ``needs_aproval`` must not silently run a side effect without
approval). MCP's ``annotations.readOnlyHint`` sets ``read_only`` unless ``x-ptc`` says otherwise.
"""

from __future__ import annotations

import re
from typing import Any, cast

from stubs_gen.errors import ManifestError
from stubs_gen.jsonpath import key
from stubs_gen.model import Mode, ToolOptions

__all__ = ["read_options"]

_KEYS = frozenset(
    {
        "mode",
        "read_only",
        "needs_approval",
        "mock",
        "summary_fields",
        "handler",
        "returns",
        "mcp_content",
    }
)
_MODES = ("echo", "mock", "host", "client")
_HANDLER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*\Z")


def _flag(options: dict[str, Any], name: str, tool: str, path: str, default: bool) -> bool:
    value = options.get(name, default)
    if not isinstance(value, bool):
        raise ManifestError(f"'{name}' must be true or false", tool=tool, path=key(path, name))
    return value


def read_options(
    options: dict[str, Any], annotations: dict[str, Any], tool: str, path: str
) -> ToolOptions:
    """The `ToolOptions` of a tool's ``x-ptc`` object found at ``path``."""
    for name in sorted(options):
        if name not in _KEYS:
            raise ManifestError(
                f"unknown x-ptc option {name!r} (known: {', '.join(sorted(_KEYS))})",
                tool=tool,
                path=key(path, name),
            )
    mode = options.get("mode", "echo")
    if mode not in _MODES:
        raise ManifestError(
            f"'mode' must be one of {', '.join(_MODES)}, not {mode!r}",
            tool=tool,
            path=key(path, "mode"),
        )
    if mode == "mock" and "mock" not in options:
        raise ManifestError("mode 'mock' needs a 'mock' result", tool=tool, path=path)
    hint = annotations.get("readOnlyHint", False)
    read_only = _flag(options, "read_only", tool, path, hint if isinstance(hint, bool) else False)
    summary = options.get("summary_fields", [])
    if not isinstance(summary, list) or not all(isinstance(s, str) for s in summary):
        raise ManifestError(
            "'summary_fields' must be an array of strings",
            tool=tool,
            path=key(path, "summary_fields"),
        )
    handler = options.get("handler")
    if handler is not None and (not isinstance(handler, str) or not _HANDLER.match(handler)):
        raise ManifestError(
            "'handler' must be a 'module:function' string", tool=tool, path=key(path, "handler")
        )
    return ToolOptions(
        mode=cast(Mode, mode),
        read_only=read_only,
        needs_approval=_flag(options, "needs_approval", tool, path, False),
        has_mock="mock" in options,
        mock=options.get("mock"),
        summary_fields=tuple(summary),
        handler=handler,
        mcp_content=_flag(options, "mcp_content", tool, path, False),
    )
