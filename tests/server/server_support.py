"""Helpers for the server tests: compact manifests."""

from __future__ import annotations

import json
from typing import Any


def manifest(*tools: tuple[Any, ...]) -> str:
    """``(name, mode, properties[, extra x-ptc options])`` tuples as manifest JSON text."""
    entries = []
    for name, mode, properties, *extra in tools:
        options = {"mode": mode, **(extra[0] if extra else {})}
        entries.append(
            {
                "name": name,
                "description": f"The {name} tool.",
                "parameters": {
                    "type": "object",
                    "properties": properties,
                    "required": sorted(properties),
                },
                "x-ptc": options,
            }
        )
    return json.dumps(entries)
