"""The execute tool with the plain OpenAI SDK (Chat Completions), on the embedded engine.

Run: ``python examples/openai_sdk_example.py``. No network: the "model" is a scripted answer
list behind an in-process HTTP transport; swap in ``openai.OpenAI()`` for a real one.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import openai

from sandbox.integrations import EmbeddedRunner, ExecuteTool
from sandbox.integrations.openai_sdk import chat_tool, handle_chat_tool_call

CODE = """import asyncio, tools
cities = ["Paris", "Oslo", "Lima"]
found = await asyncio.gather(*(tools.aio.get_weather(city=c) for c in cities))
print(max(found, key=lambda w: w["temp_c"])["city"])
"""


def get_weather(city: str) -> dict[str, Any]:
    """Current weather for a city."""
    return {"city": city, "temp_c": {"Paris": 21.5, "Oslo": 4.0, "Lima": 18.0}.get(city, 0.0)}


def scripted_model() -> httpx2.Client:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "execute_python", "arguments": json.dumps({"code": CODE})},
    }
    replies = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "assistant", "content": "Paris is the warmest."},
    ]

    def answer(request: httpx2.Request) -> httpx2.Response:
        message = replies.pop(0)
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        body = {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "scripted",
            "choices": [choice],
        }
        return httpx2.Response(200, json=body)

    return httpx2.Client(transport=httpx2.MockTransport(answer))


def main() -> None:
    client = openai.OpenAI(
        api_key="unused", base_url="http://model.invalid/v1", http_client=scripted_model()
    )
    with EmbeddedRunner() as runner:
        execute = ExecuteTool(runner, [get_weather])
        messages: list[Any] = [
            {"role": "user", "content": "Which of Paris, Oslo, Lima is warmest?"}
        ]
        while True:
            reply = client.chat.completions.create(
                model="any", messages=messages, tools=[chat_tool(execute)]
            )
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                result = handle_chat_tool_call(execute, call)
                print(result["content"], end="\n\n")
                messages.append(result)
        print("model:", message.content)


if __name__ == "__main__":
    main()
