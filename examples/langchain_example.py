"""The execute tool as a LangChain tool, driven by a scripted chat model (no network).

Run: ``python examples/langchain_example.py``. With a real model:
``llm.bind_tools([tool])`` and the same loop.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from sandbox.integrations import EmbeddedRunner, ExecuteTool
from sandbox.integrations.langchain import as_langchain_tool

CODE = """import tools
temps = {c: tools.get_weather(city=c)["temp_c"] for c in ["Paris", "Oslo", "Lima"]}
print(max(temps, key=temps.get))
"""


def get_weather(city: str) -> dict[str, Any]:
    """Current weather for a city."""
    return {"city": city, "temp_c": {"Paris": 21.5, "Oslo": 4.0, "Lima": 18.0}.get(city, 0.0)}


def main() -> None:
    model = FakeMessagesListChatModel(
        responses=[
            AIMessage(
                content="",
                tool_calls=[{"name": "execute_python", "args": {"code": CODE}, "id": "l1"}],
            ),
            AIMessage(content="Paris is the warmest."),
        ]
    )
    with EmbeddedRunner() as runner:
        tool = as_langchain_tool(ExecuteTool(runner, [get_weather]))
        messages: list[BaseMessage] = [HumanMessage("Which of Paris, Oslo, Lima is warmest?")]
        while True:
            reply = model.invoke(messages)
            messages.append(reply)
            if not isinstance(reply, AIMessage) or not reply.tool_calls:
                break
            for call in reply.tool_calls:
                result = tool.invoke(call)
                print(result.content, end="\n\n")
                messages.append(result)
        print("model:", reply.content)


if __name__ == "__main__":
    main()
