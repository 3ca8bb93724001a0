"""The LangChain adapter: a real `langchain-core` tool, a scripted chat model, a two-step task."""

from __future__ import annotations

from typing import Any

from integration_support import STEP_1, STEP_2, get_weather
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from sandbox.integrations import EmbeddedRunner, ExecuteTool
from sandbox.integrations.langchain import as_langchain_tool, mark_errors


def _call(code: str, call_id: str) -> AIMessage:
    return AIMessage(
        content="",
        tool_calls=[
            {"name": "execute_python", "args": {"code": code}, "id": call_id, "type": "tool_call"}
        ],
    )


def test_langchain_two_step_task(embedded: EmbeddedRunner) -> None:
    tool = as_langchain_tool(ExecuteTool(embedded, [get_weather]))
    assert tool.name == "execute_python"
    assert tool.tool_call_schema.model_json_schema()["required"] == ["code"]
    assert "def get_weather(*, city: str)" in tool.description
    model = FakeMessagesListChatModel(
        responses=[
            _call(STEP_1, "l1"),
            _call(STEP_2, "l2"),
            AIMessage(content="Quito, humidity 40."),
        ]
    )
    messages: list[BaseMessage] = [HumanMessage("Which city is warmest, and how humid is it?")]
    while True:
        reply = model.invoke(messages)
        messages.append(reply)
        assert isinstance(reply, AIMessage)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            messages.append(mark_errors(tool.invoke(call)))
    tool_messages = [m for m in messages if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in tool_messages] == ["l1", "l2"]
    assert "warmest: Quito" in str(tool_messages[0].content)
    assert "humidity: 40" in str(tool_messages[1].content)
    assert tool_messages[0].status == "success"
    artifact: Any = tool_messages[0].artifact
    assert artifact["status"] == "ok" and len(artifact["calls"]) == 3
    assert reply.content == "Quito, humidity 40."


def test_langchain_async_and_error_status(embedded: EmbeddedRunner) -> None:
    import asyncio

    tool = as_langchain_tool(ExecuteTool(embedded, [get_weather]))
    call = {
        "name": "execute_python",
        "args": {"code": "raise ValueError('x')"},
        "id": "e1",
        "type": "tool_call",
    }
    message = mark_errors(asyncio.run(tool.ainvoke(call)))
    assert isinstance(message, ToolMessage) and message.status == "error"
    assert "ValueError: x" in str(message.content)
