"""The execute tool as an OpenAI Agents SDK function tool (`openai-agents`).

    agent = Agent(name="analyst", tools=[as_function_tool(ExecuteTool(runner, tools=[...]))])
    result = await Runner.run(agent, "Which city is warmest?")

The tool runs on the agent's event loop (`ExecuteTool.arun`); its output is the observation
text. The parameters schema is strict (one required string, no other properties), as the SDK's
strict mode expects.
"""

from __future__ import annotations

from typing import Any

from agents import FunctionTool, RunContextWrapper

from sandbox.integrations.execute_tool import ExecuteTool

__all__ = ["as_function_tool"]


def as_function_tool(execute: ExecuteTool) -> FunctionTool:
    async def on_invoke_tool(_context: RunContextWrapper[Any], arguments: str) -> str:
        observation = await execute.arun_arguments(arguments)
        return observation.text

    return FunctionTool(
        name=execute.name,
        description=execute.description,
        params_json_schema=execute.parameters,
        on_invoke_tool=on_invoke_tool,
        strict_json_schema=True,
    )
