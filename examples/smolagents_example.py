"""A smolagents `CodeAgent` whose code runs in the sandbox, with a scripted model (no network).

The executor runs every code action of the agent in one session (`open_session`), so names
defined by one action are there in the next, as smolagents' own prompt tells the model: the
second action reads the first one's `temps`.

Run: ``python examples/smolagents_example.py``. With a real model pass any smolagents `Model`.
"""

from __future__ import annotations

from typing import Any

from smolagents import CodeAgent, tool
from smolagents.models import ChatMessage, MessageRole, Model

from sandbox.integrations import EmbeddedRunner
from sandbox.integrations.session_runners import open_session
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
            "Thought: the warmest.\n<code>\n"
            'final_answer(f"{max(temps, key=temps.get)} is the warmest.")\n</code>',
        ]

    def generate(self, messages: Any, *args: Any, **kwargs: Any) -> ChatMessage:
        return ChatMessage(role=MessageRole.ASSISTANT, content=self.replies.pop(0))


def main() -> None:
    # One session per agent run: state carries over between its code actions.
    with EmbeddedRunner() as runner, open_session(runner) as conversation:
        agent = CodeAgent(
            tools=[get_weather],
            model=ScriptedModel(),
            executor=SandboxExecutor(conversation),
            verbosity_level=0,
        )
        print("answer:", agent.run("Which of Paris, Oslo, Lima is warmest?"))


if __name__ == "__main__":
    main()
