"""Every example under examples/ runs as documented and prints what it says it prints, so none of
them can rot unnoticed.

Each is started as its own process (the way a reader would run it) with a bounded time. The
examples use scripted models and fixed tool data, so their output is deterministic: the test
asserts it line for line, except the measured times of `weather_fanout.py`, whose table is checked
for its structure and its arithmetic.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable

EXAMPLES = [*sorted(p.name for p in (ROOT / "examples").glob("*_example.py")), "weather_fanout.py"]

# What the model sees after its script ran (the adapter's observation), then its final answer.
WEATHER_OBSERVATION = (
    "status: ok · exit code 0 · 3 tool calls (3 ok)\n"
    "--- stdout ---\n"
    "Paris\n"
    "--- calls (3) ---\n"
    '#1 get_weather({"city":"Paris"}) -> ok {"city":"Paris","temp_c":21.5}\n'
    '#2 get_weather({"city":"Oslo"}) -> ok {"city":"Oslo","temp_c":4.0}\n'
    '#3 get_weather({"city":"Lima"}) -> ok {"city":"Lima","temp_c":18.0}\n'
)
SDK_OUTPUT = WEATHER_OBSERVATION + "\nmodel: Paris is the warmest.\n"

MCP_OUTPUT = (
    "stubs the model reads:\n"
    '"""Call tools.NAME(arg=...) or await tools.aio.NAME(...); bad args raise InvalidArguments,'
    ' failures ToolError; unannotated results are Any."""\n'
    "class McpText(TypedDict):\n"
    '    """Text of an MCP tool\'s answer. An answer with images, audio or resources comes as'
    " a list of McpText | McpImage | McpAudio | McpResource | McpResourceLink, in the"
    ' answer\'s order."""\n'
    "    type: Literal['text']\n"
    "    text: str\n"
    "\n"
    "class McpImage(TypedDict):\n"
    '    """An image; data is base64: base64.b64decode(item[\'data\']) is its bytes."""\n'
    "    type: Literal['image']\n"
    "    mime_type: str\n"
    "    data: str\n"
    "\n"
    "class McpAudio(TypedDict):\n"
    '    """Audio; data is base64."""\n'
    "    type: Literal['audio']\n"
    "    mime_type: str\n"
    "    data: str\n"
    "\n"
    "class McpResource(TypedDict):\n"
    '    """An embedded resource: its text, or its bytes as base64 in data."""\n'
    "    type: Literal['resource']\n"
    "    uri: str\n"
    "    mime_type: str | None\n"
    "    text: NotRequired[str]\n"
    "    data: NotRequired[str]\n"
    "\n"
    "class McpResourceLink(TypedDict):\n"
    '    """A link to a resource (not its content)."""\n'
    "    type: Literal['resource_link']\n"
    "    uri: str\n"
    "    name: str\n"
    "    mime_type: str | None\n"
    "    description: str | None\n"
    "\n"
    "class AddResult(TypedDict):\n"
    '    """addOutput\n'
    '    result: Result."""\n'
    "    result: int\n"
    "\n"
    "class ExplodeResult(TypedDict):\n"
    '    """explodeOutput\n'
    '    result: Result."""\n'
    "    result: str\n"
    "\n"
    "def get_weather(*, city: str) -> dict[str, Any]:\n"
    '    """Current weather for a city.\n'
    "    city: City.\n"
    '    Returns: get_weatherDictOutput"""\n'
    "\n"
    "def add(*, a: int, b: int) -> AddResult:\n"
    '    """Adds two integers.\n'
    "    a: A.\n"
    "    b: B.\n"
    '    Returns: addOutput"""\n'
    "\n"
    "def shout(*, text: str):\n"
    '    """Upper-cases a text.\n'
    '    text: Text."""\n'
    "\n"
    "def explode() -> ExplodeResult:\n"
    '    """Always fails.\n'
    '    Returns: explodeOutput"""\n'
    "\n"
    "status: ok · exit code 0 · 4 tool calls (1 error, 3 ok)\n"
    "--- stdout ---\n"
    "Paris\n"
    "upstream error: Error executing tool get_weather: unknown city: Atlantis\n"
    "--- calls (4) ---\n"
    '#1 get_weather({"city":"Paris"}) -> ok {"city":"Paris","temp_c":21.5,"sky":"clear"}\n'
    '#2 get_weather({"city":"Oslo"}) -> ok {"city":"Oslo","temp_c":4.0,"sky":"clear"}\n'
    '#3 get_weather({"city":"Lima"}) -> ok {"city":"Lima","temp_c":18.0,"sky":"clear"}\n'
    '#4 get_weather({"city":"Atlantis"}) -> error Error executing tool get_weather:'
    " unknown city: Atlantis\n"
)

REPLAY_OUTPUT = (
    "recorded: ok, 2 calls, 'Paris\\n'\n"
    "replayed as recorded: identical\n"
    "replayed after the change: 7 differences\n"
    "  status (changed): status was ok, is error\n"
    "  exit_code (changed): exit code was 0, is 1\n"
    "  error (changed): error was none, is TypeError: get_weather() missing 1 required "
    "keyword-only argument: 'units' (line 2)\n"
    "  stdout (changed): stdout differs: 1 line recorded, 0 lines replayed\n"
    "  stderr (changed): stderr differs: 0 lines recorded, 4 lines replayed\n"
    "  calls[1] (missing): recorded call 1 of 'get_weather' (city='Paris') was not made by the "
    "replay\n"
    "  calls[2] (missing): recorded call 2 of 'get_weather' (city='Oslo') was not made by the "
    "replay\n"
)
EXPECTED = {
    "anthropic_sdk_example.py": SDK_OUTPUT,
    "langchain_example.py": SDK_OUTPUT,
    "mcp_example.py": MCP_OUTPUT,
    "openai_agents_example.py": SDK_OUTPUT,
    "openai_sdk_example.py": SDK_OUTPUT,
    "smolagents_example.py": "answer: Paris is the warmest.\n",
    "replay_example.py": REPLAY_OUTPUT,
    "session_example.py": (
        "cell 1: ok\n3 cities fetched\ncell 2: ok\n"
        '{"Paris": 21.5, "Oslo": 4.0, "Lima": 18.0}\n'
        "value: 'Paris'\ncell 3: limit_exceeded (wall_time interrupted)\n"
        "cell 4: ok\nvalue: 'Paris at 21.5 C'\n"
    ),
}

# weather_fanout.py: everything but the two measured times is fixed by its data (100 cities
# whose temperatures come from a hash of their names).
FANOUT_HEAD = [
    "answer: hottest City090 34.3 C; coldest City058 -10.0 C; mean 12.2 C over 100 cities",
    "",
    f"{'':<22}{'PTC (one script)':>18}{'JSON tool calls':>18}",
    f"{'tool calls':<22}{100:>18}{100:>18}",
    f"{'model round trips':<22}{1:>18}{101:>18}",
    f"{'context bytes':<22}{1578:>18}{19766:>18}",
]
TIME_ROW = re.compile(r"time \(no model\) +(\d+\.\d{3})s +(\d+\.\d{3})s")
TURN_ROW = re.compile(r"at 1 s per turn +(\d+\.\d)s +(\d+\.\d)s   \((\d+)x\)")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, *args], capture_output=True, text=True, cwd=ROOT, timeout=110, check=False
    )


def test_every_example_has_its_expected_output() -> None:
    assert sorted([*EXPECTED, "weather_fanout.py"]) == sorted(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_prints_its_expected_output(name: str) -> None:
    done = _run(str(ROOT / "examples" / name))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stdout == EXPECTED[name]


def test_weather_fanout_prints_its_comparison() -> None:
    done = _run(str(ROOT / "examples" / "weather_fanout.py"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == len(FANOUT_HEAD) + 2, done.stdout
    assert lines[: len(FANOUT_HEAD)] == FANOUT_HEAD
    times = TIME_ROW.fullmatch(lines[-2])
    turns = TURN_ROW.fullmatch(lines[-1])
    assert times and turns, lines[-2:]
    ptc_s, json_s = float(times[1]), float(times[2])
    with_model_ptc, with_model_json = float(turns[1]), float(turns[2])
    assert ptc_s > 0 and json_s > 0
    # The last row adds one second per model round trip (1 and 101) to the measured times.
    assert abs(with_model_ptc - (ptc_s + 1)) <= 0.051
    assert abs(with_model_json - (json_s + 101)) <= 0.051
    assert abs(int(turns[3]) - (json_s + 101) / (ptc_s + 1)) <= 0.5 + 0.1


def test_the_demo_script_runs_through_ptc_run() -> None:
    done = _run(
        "-m", "sandbox.cli", "run", "examples/weather.py", "--tools", "examples/weather_tools.json"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "checked 5 cities; warmest: Paris\n"
