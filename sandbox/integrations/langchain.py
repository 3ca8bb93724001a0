"""The execute tool as a LangChain tool (`langchain-core`).

    tool = as_langchain_tool(ExecuteTool(runner, tools=[...]))
    model_with_tools = chat_model.bind_tools([tool])
    ...
    tool_message = tool.invoke(ai_message.tool_calls[0])   # a ToolMessage with the observation

The tool's single argument is ``code``; its description carries the stub module. Both `invoke`
(blocking) and `ainvoke` (on the caller's loop) run the script; the observation text is the
tool's output, and a script that did not end `ok` comes back as a `ToolMessage` with
`status="error"` (the observation itself says why), from `invoke` and `ainvoke` alike and so inside
any agent loop that runs tools through them (LangChain's `create_agent` / LangGraph's `ToolNode`).
The status is set on the message `run`/`arun` return (LangChain's callbacks have already been
told of the message by then): no second call, no wrapper for the caller to remember.
"""

from __future__ import annotations

from typing import Any, Literal

from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from pydantic import BaseModel, Field

from sandbox.integrations.execute_tool import ExecuteTool, Observation

__all__ = ["ExecuteLangChainTool", "as_langchain_tool", "mark_errors"]


class CodeInput(BaseModel):
    code: str = Field(description="The complete Python script to run.")


class ExecuteLangChainTool(BaseTool):
    """A LangChain `BaseTool` running its ``code`` argument through an `ExecuteTool`."""

    execute: Any = None  # ExecuteTool; Any keeps pydantic from inspecting it
    args_schema: type[BaseModel] = CodeInput
    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"

    def _format(self, observation: Observation) -> tuple[str, Any]:
        result = observation.result
        artifact = result.to_json() if result is not None else None
        return observation.text, artifact

    def run(self, tool_input: str | dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        return _with_status(super().run(tool_input, *args, **kwargs))

    async def arun(self, tool_input: str | dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        return _with_status(await super().arun(tool_input, *args, **kwargs))

    def _run(self, code: str, **_: Any) -> tuple[str, Any]:
        return self._format(self._tool().run(code))

    async def _arun(self, code: str, **_: Any) -> tuple[str, Any]:
        return self._format(await self._tool().arun(code))

    def _tool(self) -> ExecuteTool:
        if not isinstance(self.execute, ExecuteTool):
            raise TypeError("ExecuteLangChainTool needs an ExecuteTool")
        return self.execute


def as_langchain_tool(execute: ExecuteTool) -> ExecuteLangChainTool:
    return ExecuteLangChainTool(name=execute.name, description=execute.description, execute=execute)


def _with_status(output: Any) -> Any:
    """``status="error"`` on a tool message whose execution did not end `ok` (LangChain sets
    ``success`` on every message whose tool returned, whatever the script did). Called with no
    tool call id, LangChain returns the bare content: there is no status to set then."""
    if isinstance(output, ToolMessage):
        artifact = output.artifact
        if not isinstance(artifact, dict) or artifact.get("status") != "ok":
            output.status = "error"
    return output


def mark_errors(message: ToolMessage) -> ToolMessage:
    """The message with its status set from its content, which the tool already does itself:
    for callers that post-process the tool's messages with it."""
    result: ToolMessage = _with_status(message)
    return result
