"""The execute tool in the plain OpenAI SDK tool-call formats: a definition and a handler.

    execute = ExecuteTool(runner, tools=[...])
    response = client.chat.completions.create(model=..., messages=messages,
                                              tools=[chat_tool(execute)])
    for call in response.choices[0].message.tool_calls or []:
        messages.append(handle_chat_tool_call(execute, call))

Chat Completions: `chat_tool` and `handle_chat_tool_call` (takes the SDK's
`ChatCompletionMessageFunctionToolCall`, or the same shape as a dict, and returns the `tool`
role message). Responses API: `responses_tool` and `handle_response_function_call` (takes a
`ResponseFunctionToolCall` and returns its `function_call_output` item). `a`-prefixed twins run
on the caller's event loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandbox.integrations.execute_tool import ExecuteTool, Observation

__all__ = [
    "achat_tool_call",
    "ahandle_response_function_call",
    "chat_tool",
    "handle_chat_tool_call",
    "handle_response_function_call",
    "responses_tool",
]


def chat_tool(execute: ExecuteTool) -> dict[str, Any]:
    return execute.openai_definition()


def responses_tool(execute: ExecuteTool) -> dict[str, Any]:
    return execute.openai_responses_definition()


def _field(obj: Any, *path: str) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)
    return obj


def _chat_message(call: Any, observation: Observation) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": _field(call, "id"), "content": observation.text}


def handle_chat_tool_call(execute: ExecuteTool, call: Any) -> dict[str, Any]:
    """Runs one Chat Completions tool call; returns the `tool` message that answers it."""
    name, arguments = _field(call, "function", "name"), _field(call, "function", "arguments")
    return _chat_message(call, execute.run_call(name, arguments))


async def achat_tool_call(execute: ExecuteTool, call: Any) -> dict[str, Any]:
    name, arguments = _field(call, "function", "name"), _field(call, "function", "arguments")
    return _chat_message(call, await execute.arun_call(name, arguments))


def _output_item(call: Any, observation: Observation) -> dict[str, Any]:
    return {
        "type": "function_call_output",
        "call_id": _field(call, "call_id"),
        "output": observation.text,
    }


def handle_response_function_call(execute: ExecuteTool, call: Any) -> dict[str, Any]:
    """Runs one Responses API `function_call` item; returns its `function_call_output`."""
    return _output_item(call, execute.run_call(_field(call, "name"), _field(call, "arguments")))


async def ahandle_response_function_call(execute: ExecuteTool, call: Any) -> dict[str, Any]:
    observation = await execute.arun_call(_field(call, "name"), _field(call, "arguments"))
    return _output_item(call, observation)
