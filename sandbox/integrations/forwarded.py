"""`forwarded_tool`: a client-mode tool whose calls go to any async callable of the arguments.

`sandbox.client.tools.function_tool` derives a tool from a Python signature. Tools that come
from elsewhere — an upstream MCP server, a smolagents `Tool` — already carry a JSON Schema and
take their arguments as one mapping; this wraps them as a `ClientTool` so that both runners
(`Client.run`, which hands over JSON text through `invoke_json`, and `EmbeddedRunner`, which
calls `invoke`) serve them like any other client tool, and the broker has already validated the
arguments against the schema before the callable sees them.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pydantic
import pydantic_core

from sandbox.client.tools import ClientTool

__all__ = ["ForwardedTool", "forwarded_tool"]

Forward = Callable[[dict[str, Any]], Awaitable[Any]]


class _AnyArguments(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")


@dataclass(frozen=True)
class ForwardedTool(ClientTool):
    forward: Forward | None = None

    async def invoke(self, arguments: Any) -> str:
        if self.forward is None:  # pragma: no cover - constructed only by forwarded_tool
            raise RuntimeError(f"tool {self.name!r} has nowhere to forward to")
        if not isinstance(arguments, dict):
            raise TypeError(f"tool {self.name!r}: arguments must be an object")
        value = await self.forward(arguments)
        return json.dumps(pydantic_core.to_jsonable_python(value), ensure_ascii=False)

    async def invoke_json(self, arguments_json: str | bytes) -> str:
        """The path `Client.run` takes (arguments as JSON text off the stream): forwarded the
        same way as `invoke`, never to the placeholder function."""
        try:
            arguments = json.loads(arguments_json)
        except ValueError as exc:
            raise TypeError(f"tool {self.name!r}: arguments are not JSON: {exc}") from None
        return await self.invoke(arguments)


def forwarded_tool(
    name: str,
    forward: Forward,
    *,
    description: str = "",
    input_schema: Mapping[str, Any] | None = None,
    output_schema: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
) -> ForwardedTool:
    """A client-mode manifest entry (MCP dialect) for ``name`` served by ``forward``."""
    entry: dict[str, Any] = {
        "name": name,
        "description": description,
        "inputSchema": dict(input_schema or {"type": "object", "properties": {}}),
        "x-ptc": {**(options or {}), "mode": "client"},
    }
    if output_schema:
        entry["outputSchema"] = dict(output_schema)
    return ForwardedTool(name, entry, _unused, _AnyArguments, forward)


def _unused(**_: Any) -> None:  # pragma: no cover - ForwardedTool.invoke never calls it
    raise RuntimeError("a forwarded tool has no local function")
