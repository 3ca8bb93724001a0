"""The execute tool with the plain Anthropic SDK (Messages tool use), on the embedded engine.

Run: ``python examples/anthropic_sdk_example.py``. No network: the "model" is a scripted answer
list behind an in-process HTTP transport (`weather_task.scripted_http`); swap in
``anthropic.Anthropic()`` for a real one.
"""

from __future__ import annotations

from typing import Any

import anthropic
from weather_task import MODEL_URL, QUESTION, get_weather, scripted_http

from sandbox.integrations import EmbeddedRunner, ExecuteTool
from sandbox.integrations.anthropic_sdk import handle_message, tool

CODE = """import tools
temps = {c: tools.get_weather(city=c)["temp_c"] for c in ["Paris", "Oslo", "Lima"]}
print(max(temps, key=temps.get))
"""


def reply(content: list[dict[str, Any]], stop_reason: str) -> dict[str, Any]:
    """A Messages API response as the model would send it."""
    return {
        "id": "m",
        "type": "message",
        "role": "assistant",
        "model": "scripted",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }


REPLIES = [
    reply(
        [{"type": "tool_use", "id": "t1", "name": "execute_python", "input": {"code": CODE}}],
        "tool_use",
    ),
    reply([{"type": "text", "text": "Paris is the warmest."}], "end_turn"),
]


def main() -> None:
    client = anthropic.Anthropic(
        api_key="unused", base_url=MODEL_URL, http_client=scripted_http(REPLIES)
    )
    with EmbeddedRunner() as runner:
        execute = ExecuteTool(runner, [get_weather])
        messages: list[Any] = [{"role": "user", "content": QUESTION}]
        while True:
            message = client.messages.create(
                model="any", max_tokens=1024, messages=messages, tools=[tool(execute)]
            )  # type: ignore[list-item]
            content = [b.model_dump(exclude_none=True) for b in message.content]
            messages.append({"role": "assistant", "content": content})
            if message.stop_reason != "tool_use":
                break
            answer = handle_message(execute, message)  # one user turn: every tool_result
            print(answer["content"][0]["content"], end="\n\n")
            messages.append(answer)
        print("model:", message.content[0].text)  # type: ignore[union-attr]


if __name__ == "__main__":
    main()
