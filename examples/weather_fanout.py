"""A 100-city weather comparison, answered two ways by a scripted "model" (no LLM needed).

1. Programmatic tool calling: the model writes ONE script that fans out over a client-side
   `get_weather` tool with `asyncio.gather` and prints only the answer. One model round trip;
   the 100 results never enter the model's context.
2. JSON tool calling: the model asks for one `get_weather` call per turn, as a JSON object; the
   agent runs it and appends the result to the context. 100 model round trips (plus the answer),
   every result dragged through the context.

Both use the same client-side function, which runs here, in this process. Run:

    .venv/bin/python examples/weather_fanout.py                # starts a server in-process
    .venv/bin/python examples/weather_fanout.py --server ADDR  # or uses a running `ptc serve`

It prints calls, model round trips, context bytes and time for both, and what the JSON loop would
cost at a given per-turn model latency (`--turn-s`, default 1 s; nothing sleeps for it).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox.client import AsyncClient, tool

CITIES = [f"City{i:03d}" for i in range(100)]


def _fake_weather(city: str) -> dict[str, Any]:
    digest = hashlib.sha256(city.encode()).digest()
    return {
        "city": city,
        "temp_c": round(digest[0] / 255 * 45 - 10, 1),
        "humidity": digest[1] % 100,
    }


@tool(read_only=True)
async def get_weather(city: str) -> dict[str, Any]:
    """Current weather for a city.

    Args:
        city: the city's name.
    """
    await asyncio.sleep(0.005)  # a network call to a weather API, say
    return _fake_weather(city)


# -- the scripted model ------------------------------------------------------------------------
def model_writes_script(cities: list[str]) -> str:
    """What a model answers in PTC mode: one program, one round trip."""
    return (
        "import asyncio, tools\n"
        f"cities = {cities!r}\n"
        "reports = await asyncio.gather(*(tools.aio.get_weather(city=c) for c in cities))\n"
        "hot = max(reports, key=lambda r: r['temp_c'])\n"
        "cold = min(reports, key=lambda r: r['temp_c'])\n"
        "mean = sum(r['temp_c'] for r in reports) / len(reports)\n"
        "print(f\"hottest {hot['city']} {hot['temp_c']} C; coldest {cold['city']} "
        "{cold['temp_c']} C; mean {mean:.1f} C over {len(reports)} cities\")\n"
    )


def model_next_turn(context: list[dict[str, Any]], cities: list[str]) -> dict[str, Any]:
    """What a model answers in JSON mode: the next tool call, or the final answer."""
    done = {m["content"]["city"] for m in context if m["role"] == "tool"}
    for city in cities:
        if city not in done:
            return {"type": "tool_call", "name": "get_weather", "arguments": {"city": city}}
    reports = [m["content"] for m in context if m["role"] == "tool"]
    hot = max(reports, key=lambda r: r["temp_c"])
    cold = min(reports, key=lambda r: r["temp_c"])
    mean = sum(r["temp_c"] for r in reports) / len(reports)
    return {
        "type": "answer",
        "text": f"hottest {hot['city']} {hot['temp_c']} C; coldest {cold['city']} "
        f"{cold['temp_c']} C; mean {mean:.1f} C over {len(reports)} cities",
    }


# -- the two agent loops -----------------------------------------------------------------------
async def ptc(client: AsyncClient) -> dict[str, Any]:
    started = time.perf_counter()
    script = model_writes_script(CITIES)
    result = await client.run(script, tools=[get_weather])
    elapsed = time.perf_counter() - started
    assert result.status == "ok", result.stderr
    return {
        "answer": result.stdout.strip(),
        "calls": len(result.calls),
        "round_trips": 1,
        "context_bytes": len(script) + len(result.stdout),
        "seconds": elapsed,
    }


async def json_calls() -> dict[str, Any]:
    started = time.perf_counter()
    context: list[dict[str, Any]] = [{"role": "user", "content": "compare the weather"}]
    round_trips = calls = 0
    while True:
        round_trips += 1
        turn = model_next_turn(context, CITIES)
        context.append({"role": "assistant", "content": turn})
        if turn["type"] == "answer":
            break
        calls += 1
        context.append({"role": "tool", "content": await get_weather.function(**turn["arguments"])})
    return {
        "answer": turn["text"],
        "calls": calls,
        "round_trips": round_trips,
        "context_bytes": len(json.dumps(context)),
        "seconds": time.perf_counter() - started,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", help="address of a running `ptc serve`")
    parser.add_argument("--turn-s", type=float, default=1.0, help="model latency per round trip")
    args = parser.parse_args()
    server = None
    address = args.server
    if address is None:
        from sandbox.server import SandboxServer, ServerConfig

        server = SandboxServer(ServerConfig(listen="127.0.0.1:0", pool_size=1))
        address = await server.start()
    try:
        async with AsyncClient(address) as client:
            a = await ptc(client)
        b = await json_calls()
    finally:
        if server is not None:
            await server.stop()
    assert a["answer"] == b["answer"], (a["answer"], b["answer"])
    print(f"answer: {a['answer']}\n")
    print(f"{'':<22}{'PTC (one script)':>18}{'JSON tool calls':>18}")
    for key, label in (
        ("calls", "tool calls"),
        ("round_trips", "model round trips"),
        ("context_bytes", "context bytes"),
    ):
        print(f"{label:<22}{a[key]:>18}{b[key]:>18}")
    print(f"{'time (no model)':<22}{a['seconds']:>17.3f}s{b['seconds']:>17.3f}s")
    with_model_a = a["seconds"] + a["round_trips"] * args.turn_s
    with_model_b = b["seconds"] + b["round_trips"] * args.turn_s
    print(
        f"{f'at {args.turn_s:g} s per turn':<22}{with_model_a:>17.1f}s{with_model_b:>17.1f}s"
        f"   ({with_model_b / with_model_a:.0f}x)"
    )


if __name__ == "__main__":
    asyncio.run(main())
