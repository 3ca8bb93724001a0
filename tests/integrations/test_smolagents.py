"""The smolagents adapter: a real `CodeAgent` with a scripted model, its code run in our sandbox
through `SandboxExecutor`, its tools forwarded as client-side tools; a two-step task."""

from __future__ import annotations

from typing import Any

from smolagents import CodeAgent, tool
from smolagents.models import ChatMessage, MessageRole, Model

from sandbox.integrations import EmbeddedRunner
from sandbox.integrations.smolagents import SandboxExecutor, tool_schema

CALLS: list[str] = []


@tool  # type: ignore[untyped-decorator]  # smolagents ships no type information
def get_weather(city: str) -> dict[str, Any]:
    """Current weather for a city.

    Args:
        city: the city's name.
    """
    CALLS.append(city)
    return {"city": city, "temp_c": float(len(city) * 3), "humidity": 40}


class ScriptedModel(Model):  # type: ignore[misc]  # smolagents ships no type information
    def __init__(self, replies: list[str]) -> None:
        super().__init__(model_id="scripted")
        self.replies = list(replies)
        self.seen: list[Any] = []

    def generate(
        self,
        messages: Any,
        stop_sequences: Any = None,
        response_format: Any = None,
        tools_to_call_from: Any = None,
        **kwargs: Any,
    ) -> ChatMessage:
        self.seen.append(messages)
        return ChatMessage(role=MessageRole.ASSISTANT, content=self.replies.pop(0))


STEP_1 = """Thought: compare three cities.
<code>
temps = {c: get_weather(city=c)["temp_c"] for c in ["Oslo", "Rome", "Quito"]}
print("warmest:", max(temps, key=temps.get))
</code>"""

STEP_2 = """Thought: Quito is warmest; get its humidity and answer.
<code>
h = get_weather(city="Quito")["humidity"]
final_answer(f"Quito, humidity {h}")
</code>"""


def test_tool_schema_from_smolagents_inputs() -> None:
    assert tool_schema(get_weather) == {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "the city's name."}},
        "required": ["city"],
    }


def test_code_agent_two_step_task_runs_in_the_sandbox(embedded: EmbeddedRunner) -> None:
    CALLS.clear()
    model = ScriptedModel([STEP_1, STEP_2])
    executor = SandboxExecutor(embedded)
    agent = CodeAgent(
        tools=[get_weather], model=model, executor=executor, max_steps=4, verbosity_level=0
    )
    answer = agent.run("Which city is warmest, and how humid is it?")
    assert answer == "Quito, humidity 40"
    assert CALLS == ["Oslo", "Rome", "Quito", "Quito"]  # the tool ran here, called from the sandbox
    second_prompt = str(model.seen[1])
    assert "warmest: Quito" in second_prompt


def test_a_failing_code_action_is_a_step_error_the_model_sees(embedded: EmbeddedRunner) -> None:
    model = ScriptedModel(
        [
            "Thought: oops.\n<code>\nget_weather(city=3)\n</code>",
            'Thought: fixed.\n<code>\nfinal_answer("done")\n</code>',
        ]
    )
    agent = CodeAgent(
        tools=[get_weather],
        model=model,
        executor=SandboxExecutor(embedded),
        max_steps=3,
        verbosity_level=0,
    )
    assert agent.run("try") == "done"
    assert "InvalidArguments" in str(model.seen[1])
