"""Sessions: three executions in one sandbox, state kept between them (REPL cells).

The first cell fetches data through a tool and keeps it in a variable and a file; the second
uses both, and its final bare expression comes back as `value`; the third shows what a timed-out
cell does to a session that can be interrupted: nothing, the state is still there. Against a
server the same is `with client.session(...) as s: s.execute(...)`, or `ptc session create` and
`ptc run --session ID`.
"""

from __future__ import annotations

from typing import Any

from sandbox.client import RunOptions
from sandbox.integrations import EmbeddedRunner, RunRequest
from sandbox.integrations.session_runners import open_session
from sandbox.limits import Limits

TEMPERATURES = {"Paris": 21.5, "Oslo": 4.0, "Lima": 18.0}


def get_weather(city: str) -> dict[str, Any]:
    """Current weather for a city."""
    return {"city": city, "temp_c": TEMPERATURES[city]}


CELLS = [
    (
        "import tools, json\n"
        "temps = {c: tools.get_weather(city=c)['temp_c'] for c in ['Paris', 'Oslo', 'Lima']}\n"
        "_ = open('temps.json', 'w').write(json.dumps(temps))\n"
        "print(len(temps), 'cities fetched')\n"
    ),
    "warmest = max(temps, key=temps.get)\nprint(open('temps.json').read())\nwarmest",
    "while True:\n    pass",
    "f'{warmest} at {temps[warmest]} C'",
]


def main() -> None:
    with EmbeddedRunner() as runner, open_session(runner) as session:
        for index, cell in enumerate(CELLS, 1):
            limits = Limits(wall_time_ms=1000) if "while True" in cell else Limits()
            result = session.run(RunRequest(cell, [get_weather], RunOptions(limits=limits)))
            stopped = ", ".join(f"{v.limit} {v.action}" for v in result.violations)
            print(f"cell {index}: {result.status}" + (f" ({stopped})" if stopped else ""))
            if result.stdout:
                print(result.stdout, end="")
            if result.value is not None:
                print("value:", result.value)


if __name__ == "__main__":
    main()
