"""The OpenAI Agents SDK adapter: a real `Agent` and `Runner`, a scripted `Model` (no network,
tracing off), and a two-step task through the function tool."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, Model, ModelResponse, RunConfig, Runner, Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from sandbox.integrations import EmbeddedRunner, ExecuteTool
from sandbox.integrations.openai_agents import as_function_tool
from tests.integrations.integration_support import STEP_1, STEP_2, get_weather


class ScriptedModel(Model):
    """Answers with the next scripted output and remembers what it was shown."""

    def __init__(self, outputs: list[Any]) -> None:
        self.outputs = list(outputs)
        self.inputs: list[Any] = []
        self.tools: list[Any] = []

    async def get_response(
        self,
        system_instructions: Any,
        input: Any,
        model_settings: Any,
        tools: Any,
        *args: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        self.inputs.append(input)
        self.tools = list(tools)
        return ModelResponse(output=[self.outputs.pop(0)], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


def _call(code: str, call_id: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call",
        call_id=call_id,
        name="execute_python",
        arguments=json.dumps({"code": code}),
    )


def _answer(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def test_openai_agents_two_step_task(embedded: EmbeddedRunner) -> None:
    tool = as_function_tool(ExecuteTool(embedded, [get_weather]))
    model = ScriptedModel(
        [_call(STEP_1, "a1"), _call(STEP_2, "a2"), _answer("Quito, humidity 40.")]
    )
    agent = Agent(
        name="analyst", instructions="Answer with the execute tool.", tools=[tool], model=model
    )
    # Runner.run_sync leaves the event loop it creates unclosed; asyncio.run closes its own.
    result = asyncio.run(
        Runner.run(
            agent,
            "Which city is warmest, and how humid is it?",
            run_config=RunConfig(tracing_disabled=True),
        )
    )
    assert result.final_output == "Quito, humidity 40."
    assert [t.name for t in model.tools] == ["execute_python"]
    last_input = model.inputs[-1]
    outputs = [
        item
        for item in last_input
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]
    assert [o["call_id"] for o in outputs] == ["a1", "a2"]
    assert "warmest: Quito" in str(outputs[0]["output"])
    assert "humidity: 40" in str(outputs[1]["output"])
