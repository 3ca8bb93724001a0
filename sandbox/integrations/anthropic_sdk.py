"""The execute tool in the plain Anthropic SDK tool-use format: a definition and a handler.

    execute = ExecuteTool(runner, tools=[...])
    message = client.messages.create(model=..., messages=messages, tools=[tool(execute)], ...)
    messages.append({"role": "assistant", "content": message.content})
    messages.append(handle_message(execute, message))   # one user turn with every tool_result

`handle_tool_use` answers one `ToolUseBlock` (or the same shape as a dict) with a `tool_result`
block (`is_error` set when the script did not end `ok`); `handle_message` answers every
`tool_use` block of an assistant message with one `user` message, as the API expects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandbox.integrations.execute_tool import ExecuteTool, Observation

__all__ = ["ahandle_tool_use", "handle_message", "handle_tool_use", "tool"]


def tool(execute: ExecuteTool) -> dict[str, Any]:
    return execute.anthropic_definition()


def _field(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)


def _result(block: Any, observation: Observation) -> dict[str, Any]:
    return {
        "type": "tool_result",
        "tool_use_id": _field(block, "id"),
        "content": observation.text,
        "is_error": observation.is_error,
    }


def handle_tool_use(execute: ExecuteTool, block: Any) -> dict[str, Any]:
    """Runs one `tool_use` block; returns its `tool_result` block."""
    return _result(block, execute.run_call(_field(block, "name"), _field(block, "input")))


async def ahandle_tool_use(execute: ExecuteTool, block: Any) -> dict[str, Any]:
    return _result(block, await execute.arun_call(_field(block, "name"), _field(block, "input")))


def handle_message(execute: ExecuteTool, message: Any) -> dict[str, Any]:
    """The `user` message answering every `tool_use` block of an assistant message."""
    blocks = [b for b in _field(message, "content") or [] if _field(b, "type") == "tool_use"]
    return {"role": "user", "content": [handle_tool_use(execute, b) for b in blocks]}
