"""The LangChain adapter: a real `langchain-core` tool, a scripted chat model, a two-step task."""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from pydantic import BaseModel

from sandbox.integrations import EmbeddedRunner, ExecuteTool
from sandbox.integrations.langchain import as_langchain_tool
from tests.integrations.integration_support import STEP_1, STEP_2, get_weather


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
    schema = tool.tool_call_schema
    assert isinstance(schema, type) and issubclass(schema, BaseModel), schema
    assert schema.model_json_schema()["required"] == ["code"]
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
            messages.append(tool.invoke(call))
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
    message = asyncio.run(tool.ainvoke(call))
    assert isinstance(message, ToolMessage) and message.status == "error"
    assert "ValueError: x" in str(message.content)


class _ToolCallingChat(FakeMessagesListChatModel):
    """langchain-core's scripted chat model, accepting `bind_tools` as a real agent requires."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def test_failed_script_is_an_error_tool_message_with_invoke(embedded: EmbeddedRunner) -> None:
    """`tool.invoke(tool_call)` alone, no `mark_errors`: the status is the tool's own."""
    tool = as_langchain_tool(ExecuteTool(embedded, [get_weather]))
    message = tool.invoke(_call("print('before')\n1/0\n", "z1").tool_calls[0])
    assert isinstance(message, ToolMessage)
    assert message.status == "error"
    assert message.tool_call_id == "z1"
    assert "ZeroDivisionError: division by zero" in str(message.content)
    artifact: Any = message.artifact
    assert artifact["status"] == "error" and artifact["stdout"] == "before\n"
    ok = tool.invoke(_call("print('fine')\n", "z2").tool_calls[0])
    assert ok.status == "success" and "fine" in str(ok.content)


def test_failed_script_is_an_error_tool_message_in_an_agent(embedded: EmbeddedRunner) -> None:
    """LangChain's own agent loop (`create_agent`, its ToolNode) with a scripted chat model."""
    from langchain.agents import create_agent

    tool = as_langchain_tool(ExecuteTool(embedded, [get_weather]))
    model = _ToolCallingChat(
        responses=[
            _call("import tools\ntools.get_weather(city='Oslo')\n1/0\n", "a1"),
            _call(STEP_2, "a2"),
            AIMessage(content="humidity 40"),
        ]
    )
    agent = create_agent(model, [tool])
    state = agent.invoke({"messages": [HumanMessage("How humid is Quito?")]})
    tool_messages = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert [(m.tool_call_id, m.status) for m in tool_messages] == [
        ("a1", "error"),
        ("a2", "success"),
    ]
    assert "ZeroDivisionError: division by zero" in str(tool_messages[0].content)
    assert "humidity: 40" in str(tool_messages[1].content)
    assert state["messages"][-1].content == "humidity 40"
