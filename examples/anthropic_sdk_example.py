"""The execute tool with the plain Anthropic SDK (Messages tool use), on the embedded engine.

Run: ``python examples/anthropic_sdk_example.py``. No network: the "model" is a scripted answer
list behind an in-process HTTP transport; swap in ``anthropic.Anthropic()`` for a real one.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx2

from sandbox.integrations import EmbeddedRunner, ExecuteTool
from sandbox.integrations.anthropic_sdk import handle_message, tool

CODE = """import tools
temps = {c: tools.get_weather(city=c)["temp_c"] for c in ["Paris", "Oslo", "Lima"]}
print(max(temps, key=temps.get))
"""


def get_weather(city: str) -> dict[str, Any]:
    """Current weather for a city."""
    return {"city": city, "temp_c": {"Paris": 21.5, "Oslo": 4.0, "Lima": 18.0}.get(city, 0.0)}


def scripted_model() -> httpx2.Client:
    replies = [
        (
            [{"type": "tool_use", "id": "t1", "name": "execute_python", "input": {"code": CODE}}],
            "tool_use",
        ),
        ([{"type": "text", "text": "Paris is the warmest."}], "end_turn"),
    ]

    def answer(request: httpx2.Request) -> httpx2.Response:
        content, stop = replies.pop(0)
        body = {
            "id": "m",
            "type": "message",
            "role": "assistant",
            "model": "scripted",
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return httpx2.Response(200, json=body)

    return httpx2.Client(transport=httpx2.MockTransport(answer))


def main() -> None:
    client = anthropic.Anthropic(
        api_key="unused", base_url="http://model.invalid", http_client=scripted_model()
    )
    with EmbeddedRunner() as runner:
        execute = ExecuteTool(runner, [get_weather])
        messages: list[Any] = [
            {"role": "user", "content": "Which of Paris, Oslo, Lima is warmest?"}
        ]
        while True:
            message = client.messages.create(
                model="any", max_tokens=1024, messages=messages, tools=[tool(execute)]
            )  # type: ignore[list-item]
            messages.append(
                {
                    "role": "assistant",
                    "content": [b.model_dump(exclude_none=True) for b in message.content],
                }
            )
            if message.stop_reason != "tool_use":
                break
            answer = handle_message(execute, message)
            print(answer["content"][0]["content"], end="\n\n")
            messages.append(answer)
        print("model:", message.content[0].text)  # type: ignore[union-attr]


if __name__ == "__main__":
    main()
