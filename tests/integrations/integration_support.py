"""Helpers shared by the integration tests (imported by name: tests are not a package)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
UPSTREAM_SERVER = HERE / "upstream_server.py"
PYTHON = sys.executable

CITIES = ["Paris", "Oslo", "Lima", "Rome", "Kyiv", "Quito"]


def get_weather(city: str) -> dict[str, Any]:
    """Current weather for a city.

    Args:
        city: the city's name.
    """
    return {"city": city, "temp_c": float(len(city) * 3), "humidity": 40, "station": "X" * 20}


def leftover_children() -> list[str]:
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            out.append(f"{child.pid}: {' '.join(child.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            continue
    return out


STEP_1 = (
    "import tools\n"
    "temps = {c: tools.get_weather(city=c)['temp_c'] for c in ['Oslo', 'Rome', 'Quito']}\n"
    "print('warmest:', max(temps, key=temps.get))\n"
)
STEP_2 = "import tools\nprint('humidity:', tools.get_weather(city='Quito')['humidity'])\n"


def scripted_http(
    responses: list[dict[str, Any]], requests: list[dict[str, Any]], module: str = "httpx"
) -> Any:
    """An httpx client whose transport answers each request with the next scripted response:
    the scripted model of the SDK tests (no network). ``module``: "httpx" or "httpx2", the
    flavour the SDK under test is built on."""
    import importlib
    import json

    httpx = importlib.import_module(module)

    queue = list(responses)

    def answer(request: Any) -> Any:  # httpx.Request -> httpx.Response, of the flavour imported
        requests.append(json.loads(request.content))
        return httpx.Response(200, json=queue.pop(0))

    return httpx.Client(transport=httpx.MockTransport(answer))
