"""A smolagents `CodeAgent` whose code runs in the sandbox, with a scripted model (no network).

Run: ``python examples/smolagents_example.py``. With a real model pass any smolagents `Model`.
"""

from __future__ import annotations

from typing import Any

from smolagents import CodeAgent, tool
from smolagents.models import ChatMessage, MessageRole, Model

from sandbox.integrations import EmbeddedRunner
from sandbox.integrations.smolagents import SandboxExecutor


@tool
def get_weather(city: str) -> dict:  # type: ignore[type-arg]
    """Current weather for a city.

    Args:
        city: the city's name.
    """
    return {"city": city, "temp_c": {"Paris": 21.5, "Oslo": 4.0, "Lima": 18.0}.get(city, 0.0)}


class ScriptedModel(Model):
    def __init__(self) -> None:
        super().__init__(model_id="scripted")
        self.replies = [
            "Thought: compare.\n<code>\n"
            'temps = {c: get_weather(city=c)["temp_c"] for c in ["Paris", "Oslo", "Lima"]}\n'
            "print(temps)\n</code>",
            'Thought: Paris wins.\n<code>\nfinal_answer("Paris is the warmest.")\n</code>',
        ]

    def generate(self, messages: Any, *args: Any, **kwargs: Any) -> ChatMessage:
        return ChatMessage(role=MessageRole.ASSISTANT, content=self.replies.pop(0))


def main() -> None:
    with EmbeddedRunner() as runner:
        agent = CodeAgent(
            tools=[get_weather],
            model=ScriptedModel(),
            executor=SandboxExecutor(runner),
            verbosity_level=0,
        )
        print("answer:", agent.run("Which of Paris, Oslo, Lima is warmest?"))


if __name__ == "__main__":
    main()
