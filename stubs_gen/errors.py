"""The one error `stubs_gen` raises on bad input: `ManifestError`.

Every public function of the package converts whatever goes wrong with a manifest (not JSON, an
unknown dialect, a missing or colliding name, an invalid schema, bad ``x-ptc`` options) into this
exception, naming the tool and the JSON path of the offending construct, so callers (the CLI, the
server, the broker) can show it to a user verbatim and never print a traceback.
"""

from __future__ import annotations

__all__ = ["ManifestError"]


class ManifestError(Exception):
    """A manifest that cannot be turned into stubs.

    ``tool`` is the tool's name when known (or its position, like ``"tools[3]"``); ``path`` is the
    JSON path of the construct at fault, like ``"$.tools[3].function.parameters.properties.x"``.
    """

    def __init__(self, reason: str, *, tool: str | None = None, path: str = "$") -> None:
        self.reason = reason
        self.tool = tool
        self.path = path
        where = f"tool {tool!r} at {path}" if tool is not None else f"at {path}"
        super().__init__(f"{where}: {reason}")
