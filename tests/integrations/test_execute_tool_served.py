"""The execute tool through the client SDK and a real `ptc serve`-like server: client-side
functions run here, `expected_calls` travels through the RPC."""

from __future__ import annotations

import asyncio

from sandbox.expectations import ExpectedCalls
from sandbox.integrations import ClientRunner, ExecuteTool
from tests.integrations.integration_support import get_weather

SCRIPT = (
    "import asyncio, tools\n"
    "cities = [f'city-{{i}}' for i in range({n})]\n"
    "temps = await asyncio.gather(*(tools.aio.get_weather(city=c) for c in cities))\n"
    "print(len(temps), max(t['temp_c'] for t in temps))\n"
)


def test_expected_calls_through_the_server_flags_70_of_100(served: ClientRunner) -> None:
    execute = ExecuteTool(served, [get_weather], expected_calls=[ExpectedCalls("get_weather", 100)])
    observation = execute.run(SCRIPT.format(n=70))
    assert observation.result is not None
    assert observation.result.status == "limit_exceeded"
    assert observation.result.stdout.startswith("70 ")
    assert "get_weather: expected at least 100 calls, saw 70" in observation.text


def test_expected_calls_through_the_server_passes_100(served: ClientRunner) -> None:
    execute = ExecuteTool(served, [get_weather], expected_calls=[ExpectedCalls("get_weather", 100)])
    observation = execute.run(SCRIPT.format(n=100))
    assert observation.result is not None
    assert (observation.result.status, observation.result.violations) == ("ok", [])
    assert len(observation.result.calls) == 100
    assert "[... 70 calls cut" in observation.text  # 30 of 100 call lines by default


def test_arun_works_from_inside_an_event_loop(served: ClientRunner) -> None:
    execute = ExecuteTool(served, [get_weather])
    code = "import tools\nprint(tools.get_weather(city='Oslo')['city'])"
    observation = asyncio.run(execute.arun(code))
    assert observation.result is not None and observation.result.stdout == "Oslo\n"
