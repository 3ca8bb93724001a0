"""The plain OpenAI and Anthropic SDK formats: the real SDK clients, a scripted model behind an
in-process HTTP transport, and a two-step task through the execute tool."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai

from sandbox.integrations import EmbeddedRunner, ExecuteTool, anthropic_sdk, openai_sdk
from tests.integrations.integration_support import STEP_1, STEP_2, get_weather, scripted_http


def _chat(tool_code: str | None, call_id: str, text: str = "") -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if tool_code is not None:
        message["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": "execute_python",
                    "arguments": json.dumps({"code": tool_code}),
                },
            }
        ]
    return {
        "id": f"chatcmpl-{call_id}",
        "object": "chat.completion",
        "created": 0,
        "model": "scripted",
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if tool_code else "stop"}
        ],
    }


def test_openai_chat_two_step_task(embedded: EmbeddedRunner) -> None:
    execute = ExecuteTool(embedded, [get_weather])
    requests: list[dict[str, Any]] = []
    script = [_chat(STEP_1, "c1"), _chat(STEP_2, "c2"), _chat(None, "c3", "Quito, humidity 40.")]
    client = openai.OpenAI(
        api_key="test",
        base_url="http://model.invalid/v1",
        http_client=scripted_http(script, requests),
    )
    messages: list[Any] = [
        {"role": "user", "content": "Which city is warmest, and how humid is it?"}
    ]
    while True:
        response = client.chat.completions.create(
            model="scripted",
            messages=messages,
            # chat_tool returns a plain dict: the integration does not import openai's TypedDicts.
            tools=[openai_sdk.chat_tool(execute)],  # type: ignore[list-item]
        )
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages.append(openai_sdk.handle_chat_tool_call(execute, call))
    assert message.content == "Quito, humidity 40."
    assert requests[0]["tools"][0]["function"]["name"] == "execute_python"
    assert "def get_weather(*, city: str)" in requests[0]["tools"][0]["function"]["description"]
    tool_messages = [m for m in requests[2]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["c1", "c2"]
    assert "warmest: Quito" in tool_messages[0]["content"]
    assert "humidity: 40" in tool_messages[1]["content"]


def test_openai_responses_function_call_item(embedded: EmbeddedRunner) -> None:
    from openai.types.responses import ResponseFunctionToolCall

    execute = ExecuteTool(embedded, [get_weather])
    item = ResponseFunctionToolCall(
        type="function_call",
        call_id="r1",
        name="execute_python",
        arguments=json.dumps({"code": STEP_2}),
    )
    output = openai_sdk.handle_response_function_call(execute, item)
    assert output["type"] == "function_call_output" and output["call_id"] == "r1"
    assert "humidity: 40" in output["output"]
    wrong = openai_sdk.handle_response_function_call(
        execute, item.model_copy(update={"name": "other"})
    )
    assert "unknown tool 'other'" in wrong["output"]


def _message(tool_code: str | None, use_id: str, text: str = "") -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text or "Running a script."}]
    if tool_code is not None:
        content.append(
            {
                "type": "tool_use",
                "id": use_id,
                "name": "execute_python",
                "input": {"code": tool_code},
            }
        )
    return {
        "id": f"msg_{use_id}",
        "type": "message",
        "role": "assistant",
        "model": "scripted",
        "content": content,
        "stop_reason": "tool_use" if tool_code else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }


def test_anthropic_two_step_task(embedded: EmbeddedRunner) -> None:
    execute = ExecuteTool(embedded, [get_weather])
    requests: list[dict[str, Any]] = []
    script = [
        _message(STEP_1, "t1"),
        _message(STEP_2, "t2"),
        _message(None, "t3", "Quito, humidity 40."),
    ]
    client = anthropic.Anthropic(
        api_key="test",
        base_url="http://model.invalid",
        http_client=scripted_http(script, requests, "httpx2"),
    )
    messages: list[Any] = [
        {"role": "user", "content": "Which city is warmest, and how humid is it?"}
    ]
    while True:
        message = client.messages.create(
            model="scripted",
            max_tokens=512,
            messages=messages,
            # tool() returns a plain dict: the integration does not import anthropic's TypedDicts.
            tools=[anthropic_sdk.tool(execute)],  # type: ignore[list-item]
        )
        messages.append(
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in message.content],
            }
        )
        if message.stop_reason != "tool_use":
            break
        messages.append(anthropic_sdk.handle_message(execute, message))
    assert message.content[0].text == "Quito, humidity 40."  # type: ignore[union-attr]
    assert requests[0]["tools"][0]["input_schema"]["required"] == ["code"]
    results = [
        block
        for m in requests[2]["messages"]
        if m["role"] == "user" and isinstance(m["content"], list)
        for block in m["content"]
    ]
    assert [r["tool_use_id"] for r in results] == ["t1", "t2"]
    assert "warmest: Quito" in results[0]["content"] and results[0]["is_error"] is False
    assert "humidity: 40" in results[1]["content"]


def test_anthropic_failed_script_sets_is_error(embedded: EmbeddedRunner) -> None:
    execute = ExecuteTool(embedded, [get_weather])
    block = {"type": "tool_use", "id": "t9", "name": "execute_python", "input": {"code": "1/0"}}
    result = anthropic_sdk.handle_tool_use(execute, block)
    assert result["is_error"] is True and "ZeroDivisionError" in result["content"]


def test_a_call_of_another_tool_is_answered_without_running(embedded: EmbeddedRunner) -> None:
    """Every adapter, sync and async, answers a call of a tool the model was never given with
    the same error observation (`ExecuteTool.run_call`), and runs nothing for it."""
    import asyncio

    execute = ExecuteTool(embedded, [get_weather])
    said = "error: unknown tool 'get_weather'; the only tool is 'execute_python'"
    code = {"code": "print('ran')"}
    use = {"type": "tool_use", "id": "t1", "name": "get_weather", "input": code}
    chat = {"id": "c1", "function": {"name": "get_weather", "arguments": json.dumps(code)}}
    item = {"call_id": "r1", "name": "get_weather", "arguments": json.dumps(code)}

    async def answers() -> list[str]:
        return [
            (await anthropic_sdk.ahandle_tool_use(execute, use))["content"],
            (await openai_sdk.achat_tool_call(execute, chat))["content"],
            (await openai_sdk.ahandle_response_function_call(execute, item))["output"],
        ]

    assert anthropic_sdk.handle_tool_use(execute, use) == {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": said,
        "is_error": True,
    }
    assert openai_sdk.handle_chat_tool_call(execute, chat)["content"] == said
    assert openai_sdk.handle_response_function_call(execute, item)["output"] == said
    assert asyncio.run(answers()) == [said, said, said]
    # The right name runs the script: the refusal above came from the name alone.
    assert "ran" in execute.run_call("execute_python", code).text
