"""The execute tool as an OpenAI Agents SDK function tool, with a scripted model (no network,
tracing off). Run: ``python examples/openai_agents_example.py``; with a real model drop
``model=`` and the run config."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, Model, ModelResponse, RunConfig, Runner, Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from weather_task import QUESTION, get_weather

from sandbox.integrations import EmbeddedRunner, ExecuteTool
from sandbox.integrations.openai_agents import as_function_tool

CODE = """import tools
temps = {c: tools.get_weather(city=c)["temp_c"] for c in ["Paris", "Oslo", "Lima"]}
print(max(temps, key=temps.get))
"""


class ScriptedModel(Model):
    def __init__(self) -> None:
        text = ResponseOutputText(type="output_text", text="Paris is the warmest.", annotations=[])
        self.outputs: list[Any] = [
            ResponseFunctionToolCall(
                type="function_call",
                call_id="a1",
                name="execute_python",
                arguments=json.dumps({"code": CODE}),
            ),
            ResponseOutputMessage(
                id="m", type="message", role="assistant", status="completed", content=[text]
            ),
        ]

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        return ModelResponse(output=[self.outputs.pop(0)], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


def main() -> None:
    with EmbeddedRunner() as runner:
        tool = as_function_tool(ExecuteTool(runner, [get_weather]))
        agent = Agent(
            name="weather",
            instructions="Use the execute tool.",
            tools=[tool],
            model=ScriptedModel(),
        )
        result = Runner.run_sync(
            agent,
            QUESTION,
            run_config=RunConfig(tracing_disabled=True),
        )
        for item in result.new_items:
            if item.type == "tool_call_output_item":
                print(item.output, end="\n\n")
        print("model:", result.final_output)


if __name__ == "__main__":
    main()
