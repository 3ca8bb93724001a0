"""The execute tool in a LangChain agent (`create_agent`, on LangGraph), driven by a scripted
chat model (no network).

Install: ``pip install ".[langchain]"`` from a checkout (it brings LangChain and LangGraph).
Run: ``python examples/langchain_example.py``. With a real model, pass it (e.g.
``init_chat_model("openai:gpt-5")``) to `create_agent` instead of the scripted one.
"""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from weather_task import QUESTION, get_weather

from sandbox.integrations import EmbeddedRunner, ExecuteTool
from sandbox.integrations.langchain import as_langchain_tool

CODE = """import tools
temps = {c: tools.get_weather(city=c)["temp_c"] for c in ["Paris", "Oslo", "Lima"]}
print(max(temps, key=temps.get))
"""


class ScriptedModel(FakeMessagesListChatModel):
    """Answers with its scripted messages in order; the tools it is bound to change nothing."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self


def main() -> None:
    model = ScriptedModel(
        responses=[
            AIMessage(
                content="",
                tool_calls=[{"name": "execute_python", "args": {"code": CODE}, "id": "l1"}],
            ),
            AIMessage(content="Paris is the warmest."),
        ]
    )
    with EmbeddedRunner() as runner:
        agent = create_agent(model, [as_langchain_tool(ExecuteTool(runner, [get_weather]))])
        state = agent.invoke({"messages": [HumanMessage(QUESTION)]})
    for message in state["messages"]:
        if isinstance(message, ToolMessage):
            print(message.content, end="\n\n")
    print("model:", state["messages"][-1].content)


if __name__ == "__main__":
    main()
