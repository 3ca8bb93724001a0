"""The execute tool on the embedded engine: definitions, a run, `expected_calls`, refusals."""

from __future__ import annotations

import json

import pytest

from sandbox.expectations import ExpectedCalls
from sandbox.integrations import CALLING_CONVENTION, EmbeddedRunner, ExecuteTool
from stubs_gen import load_manifest
from tests.integrations.integration_support import CITIES, get_weather

ITEMS = [f"item-{i:03d}" for i in range(100)]
LOOKUP = {
    "name": "lookup",
    "description": "Looks an item up.",
    "parameters": {
        "type": "object",
        "properties": {"item": {"type": "string"}},
        "required": ["item"],
    },
    "x-ptc": {"mode": "echo", "read_only": True},
}


def _enumerate(count: int) -> str:
    return (
        "import asyncio, tools\n"
        f"items = [f'item-{{i:03d}}' for i in range({count})]\n"
        "found = await asyncio.gather(*(tools.aio.lookup(item=i) for i in items))\n"
        "print(len(found))\n"
    )


def test_definitions_carry_the_stubs_in_three_dialects(embedded: EmbeddedRunner) -> None:
    execute = ExecuteTool(embedded, [get_weather, LOOKUP])
    openai = execute.openai_definition()
    anthropic = execute.anthropic_definition()
    mcp = execute.mcp_definition()
    assert openai["type"] == "function" and openai["function"]["name"] == "execute_python"
    assert anthropic["name"] == mcp["name"] == "execute_python"
    schemas = [openai["function"]["parameters"], anthropic["input_schema"], mcp["inputSchema"]]
    for schema in schemas:
        assert schema["required"] == ["code"] and schema["properties"]["code"]["type"] == "string"
    description = anthropic["description"]
    assert description.startswith(CALLING_CONVENTION)
    assert "def get_weather(*, city: str) -> dict[str, Any]:" in description
    assert "def lookup(*, item: str):" in description
    # Each definition is itself a valid manifest entry in its dialect.
    assert load_manifest([openai, anthropic | {"name": "b"}, mcp | {"name": "c"}]).names


def test_a_two_call_script_runs_client_functions_and_reports_them(embedded: EmbeddedRunner) -> None:
    execute = ExecuteTool(embedded, [get_weather])
    observation = execute.run_arguments(
        json.dumps(
            {
                "code": "import tools\nfor c in ['Paris', 'Oslo']:\n    print(c, tools.get_weather(city=c)['temp_c'])\n"
            }
        )
    )
    assert not observation.is_error
    assert "Paris 15.0\nOslo 12.0" in observation.text
    assert observation.text.count("-> ok") == 2
    assert (
        observation.result is not None
        and [c.tool for c in observation.result.calls] == ["get_weather"] * 2
    )


def test_expected_calls_flags_70_of_100(embedded: EmbeddedRunner) -> None:
    execute = ExecuteTool(embedded, [LOOKUP], expected_calls=[ExpectedCalls("lookup", 100, 100)])
    observation = execute.run(_enumerate(70))
    result = observation.result
    assert result is not None and result.status == "limit_exceeded" and result.stdout == "70\n"
    [violation] = result.violations
    assert (violation.limit, violation.limit_value, violation.observed) == (
        "expected_calls",
        100,
        70,
    )
    assert observation.is_error
    assert (
        "expected_calls: lookup: expected at least 100 calls, saw 70 (checked after the script ended)"
        in observation.text
    )


def test_expected_calls_passes_100_of_100(embedded: EmbeddedRunner) -> None:
    execute = ExecuteTool(embedded, [LOOKUP], expected_calls=[ExpectedCalls("lookup", 100, 100)])
    observation = execute.run(_enumerate(100))
    assert observation.result is not None
    assert (observation.result.status, observation.result.violations) == ("ok", [])
    assert "violations" not in observation.text


def test_expected_calls_flags_an_excess(embedded: EmbeddedRunner) -> None:
    execute = ExecuteTool(embedded, [LOOKUP])
    observation = execute.run(_enumerate(3), expected_calls=[ExpectedCalls("lookup", None, 2)])
    assert "lookup: expected at most 2 calls, saw 3" in observation.text


def test_failing_client_tool_reaches_the_script_as_tool_error(embedded: EmbeddedRunner) -> None:
    def flaky(city: str) -> str:
        """Fails for Lima."""
        if city == "Lima":
            raise LookupError("no station in Lima")
        return city

    execute = ExecuteTool(embedded, [flaky])
    code = (
        "import tools\n"
        "for c in ['Paris', 'Lima']:\n"
        "    try:\n        print(tools.flaky(city=c))\n"
        "    except tools.ToolError as e:\n        print('failed:', e)\n"
    )
    observation = execute.run(code)
    assert "Paris\nfailed: LookupError: no station in Lima" in observation.text
    assert '#2 flaky({"city":"Lima"}) -> error LookupError: no station in Lima' in observation.text


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        pytest.param("not json", "takes one argument", id="not-json"),
        pytest.param({"script": "print(1)"}, "takes one argument", id="no-code"),
        pytest.param({"code": "print("}, "SyntaxError", id="syntax-error"),
    ],
)
def test_bad_calls_become_error_observations(
    embedded: EmbeddedRunner, arguments: object, expected: str
) -> None:
    observation = ExecuteTool(embedded).run_arguments(arguments)  # type: ignore[arg-type]
    assert observation.is_error and expected in observation.text


def test_a_refused_request_is_an_observation_not_an_exception(embedded: EmbeddedRunner) -> None:
    execute = ExecuteTool(embedded, [LOOKUP], expected_calls=[ExpectedCalls("nope", 1)])
    observation = execute.run("print(1)")
    assert observation.result is None and observation.is_error
    assert "refused the request" in observation.text and "nope" in observation.text


def test_summary_fields_of_the_manifest_shape_the_call_lines(embedded: EmbeddedRunner) -> None:
    weather = {
        "name": "weather",
        "description": "Weather.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
        "x-ptc": {
            "mode": "mock",
            "mock": {"temp_c": 7, "raw": "r" * 300},
            "summary_fields": ["temp_c"],
        },
    }
    execute = ExecuteTool(embedded, [weather])
    observation = execute.run(
        "import tools\n" + "".join(f"tools.weather(city={c!r})\n" for c in CITIES)
    )
    assert observation.text.count('-> ok {"temp_c":7}') == len(CITIES)
    assert "rrrr" not in observation.text


def test_files_bound_to_the_tool_and_per_run(embedded: EmbeddedRunner) -> None:
    """A conversation's uploads bound to the tool, one more file for one run; the observation
    lists what the script left under outputs/ and what was not returned."""
    execute = ExecuteTool(embedded, [], files={"upload.csv": b"a,b\n1,2\n"})
    code = (
        "import os\n"
        "rows = open('upload.csv').read().splitlines() + open('extra.txt').read().splitlines()\n"
        "open('outputs/rows.txt', 'w').write(str(len(rows)))\n"
        "os.symlink('/etc/passwd', 'outputs/passwd')\n"
    )
    observation = execute.run(code, files={"extra.txt": b"x\ny\n"})
    assert observation.result is not None
    assert [(f.name, f.data) for f in observation.result.output_files] == [("rows.txt", b"4")]
    sha = observation.result.output_files[0].sha256
    assert f"outputs/rows.txt: 1 bytes, sha256 {sha}" in observation.text
    assert "outputs/passwd: not returned (symlink, 11 bytes)" in observation.text
    assert [d.name for d in observation.result.input_files] == ["upload.csv", "extra.txt"]
