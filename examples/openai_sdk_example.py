"""The execute tool with the plain OpenAI SDK (Chat Completions), on the embedded engine.

Run: ``python examples/openai_sdk_example.py``. No network: the "model" is a scripted answer
list behind an in-process HTTP transport (`weather_task.scripted_http`); swap in
``openai.OpenAI()`` for a real one.
"""

from __future__ import annotations

import json
from typing import Any

import openai
from weather_task import MODEL_URL, QUESTION, get_weather, scripted_http

from sandbox.integrations import EmbeddedRunner, ExecuteTool
from sandbox.integrations.openai_sdk import chat_tool, handle_chat_tool_call

CODE = """import asyncio, tools
cities = ["Paris", "Oslo", "Lima"]
found = await asyncio.gather(*(tools.aio.get_weather(city=c) for c in cities))
print(max(found, key=lambda w: w["temp_c"])["city"])
"""


def reply(message: dict[str, Any]) -> dict[str, Any]:
    """A Chat Completions response as the model would send it."""
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "scripted",
            "choices": [choice]}  # fmt: skip


CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "execute_python", "arguments": json.dumps({"code": CODE})},
}
REPLIES = [
    reply({"role": "assistant", "content": None, "tool_calls": [CALL]}),
    reply({"role": "assistant", "content": "Paris is the warmest."}),
]


def main() -> None:
    client = openai.OpenAI(
        api_key="unused", base_url=f"{MODEL_URL}/v1", http_client=scripted_http(REPLIES)
    )
    with EmbeddedRunner() as runner:
        execute = ExecuteTool(runner, [get_weather])
        messages: list[Any] = [{"role": "user", "content": QUESTION}]
        while True:
            completion = client.chat.completions.create(
                model="any", messages=messages, tools=[chat_tool(execute)]
            )
            message = completion.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:  # each answered by its own `tool` message
                result = handle_chat_tool_call(execute, call)
                print(result["content"], end="\n\n")
                messages.append(result)
        print("model:", message.content)


if __name__ == "__main__":
    main()
