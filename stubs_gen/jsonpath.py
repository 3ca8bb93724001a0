"""JSON paths for error messages and warnings (``$.tools[3].function.parameters.properties.x``)."""

from __future__ import annotations

import re

__all__ = ["index", "key"]

_PLAIN = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*\Z")


def key(path: str, name: str) -> str:
    """``path`` extended by an object member, bracket-quoted when it is not a plain word."""
    if _PLAIN.match(name):
        return f"{path}.{name}"
    escaped = name.replace("\\", "\\\\").replace("'", "\\'")
    return f"{path}['{escaped}']"


def index(path: str, position: int) -> str:
    """``path`` extended by an array index."""
    return f"{path}[{position}]"
