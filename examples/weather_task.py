"""The task the framework examples give a model, and the stand-in for the model itself.

Every `*_example.py` asks the same question with the same one tool (`get_weather`, fixed data),
so that each shows only what differs: its framework's way to hand the model the execute tool and
to answer the model's call. The plain SDK examples talk to their SDK's real client, whose HTTP
transport is `scripted_http`: the model's replies, written in advance (no network, no key). For
a real model, drop the ``http_client`` and ``base_url`` arguments.
"""

from __future__ import annotations

from typing import Any

QUESTION = "Which of Paris, Oslo, Lima is warmest?"
MODEL_URL = "http://model.invalid"  # never reached: the scripted transport answers first


def get_weather(city: str) -> dict[str, Any]:
    """Current weather for a city."""
    return {"city": city, "temp_c": {"Paris": 21.5, "Oslo": 4.0, "Lima": 18.0}.get(city, 0.0)}


def scripted_http(replies: list[dict[str, Any]]) -> Any:
    """An ``httpx2.Client`` whose every request is answered with the next of ``replies`` (the
    JSON bodies the model's API would return). Imported here, not at the top, so that the
    framework examples that need no HTTP client do not need httpx2."""
    import httpx2

    pending = list(replies)

    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, json=pending.pop(0))

    return httpx2.Client(transport=httpx2.MockTransport(answer))
