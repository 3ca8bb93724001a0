"""`ptc mcp --upstream` at its edges, driven as a user drives it: `ptc mcp` as a real process,
the official `mcp` client over stdio, and upstream MCP servers written for the tests, started by
`ptc mcp` as real subprocesses (no network, no npm).

- an upstream that cannot start (exits at once, missing command) is one line naming it;
- named upstreams (`NAME="COMMAND ..."`) offer their tools as `NAME__TOOL`, so two servers with
  the same tool names work together, beside an unnamed one that keeps its names;
- images, audio, embedded resources and resource links reach the script as typed items
  (documented in the stubs), bounded by the result cap and the call log's budget like any result.
"""

from __future__ import annotations

import asyncio
import base64
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp import types as mcp_types

from tests.integrations.integration_support import HERE, PYTHON, UPSTREAM_SERVER, leftover_children
from tests.ptc_cli import run_ptc

CONTENT_SERVER = HERE / "upstream_content.py"
EXITING_SERVER = HERE / "upstream_exits.py"


def _command(*argv: str | Path) -> str:
    return shlex.join([PYTHON, *map(str, argv)])


def _ptc_mcp(*args: str) -> subprocess.CompletedProcess[str]:
    """`ptc mcp ARGS` that is expected to stop before it serves (stdin closed at once)."""
    return run_ptc("mcp", *args)


def _text(result: Any) -> str:
    assert isinstance(result, mcp_types.CallToolResult)
    return "\n".join(b.text for b in result.content if isinstance(b, mcp_types.TextContent))


async def _conversation(args: list[str], work: Any) -> Any:
    params = StdioServerParameters(command=PYTHON, args=["-m", "sandbox.cli", "mcp", *args])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return await work(session)


# -- an upstream that cannot start ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("upstream", "reason"),
    [
        pytest.param(
            _command(EXITING_SERVER),
            "the server stopped before it finished starting (Connection closed); "
            "its own error output, if any, is above",
            id="exits-at-start",
        ),
        pytest.param(
            "git=" + _command(EXITING_SERVER),
            "the server stopped before it finished starting (Connection closed); "
            "its own error output, if any, is above",
            id="named-exits-at-start",
        ),
        pytest.param(
            "ptc-no-such-mcp-server --flag",
            "[Errno 2] No such file or directory: 'ptc-no-such-mcp-server'",
            id="missing-command",
        ),
    ],
)
def test_an_upstream_that_cannot_start_is_one_line_naming_it(upstream: str, reason: str) -> None:
    weather = _command(UPSTREAM_SERVER)  # a good one first: it is stopped again
    run = _ptc_mcp("--upstream", weather, "--upstream", upstream)
    assert run.returncode == 2
    assert run.stdout == ""  # the protocol channel stays clean
    assert "Traceback" not in run.stderr
    ours = f"ptc mcp: --upstream {upstream!r}: {reason}"
    assert run.stderr.splitlines()[-1] == ours
    if "exits" in upstream:  # the upstream's own words come first, then ours: nothing else
        assert run.stderr == "upstream_exits: /nowhere is not a git repository\n" + ours + "\n"
    assert leftover_children() == []


@pytest.mark.parametrize(
    ("upstreams", "message"),
    [
        pytest.param(
            ["my-docs=" + _command(CONTENT_SERVER)],
            "'my-docs' is not a valid upstream name (letters and digits, single '_' between "
            'them, starting with a letter: e.g. docs="npx ...")',
            id="bad-name",
        ),
        pytest.param(
            ["docs__x=" + _command(CONTENT_SERVER)],
            "'docs__x' is not a valid upstream name",
            id="double-underscore-name",
        ),
        pytest.param(
            ["docs=" + _command(CONTENT_SERVER, "a"), "docs=" + _command(CONTENT_SERVER, "b")],
            f"the name 'docs' is already given to --upstream "
            f"{'docs=' + _command(CONTENT_SERVER, 'a')!r}",
            id="same-name-twice",
        ),
        pytest.param(
            [_command(CONTENT_SERVER, "a"), _command(CONTENT_SERVER, "b")],
            "tool 'read_file' is already provided; name each upstream (--upstream "
            'NAME="COMMAND ...") to offer its tools as NAME__TOOL',
            id="same-tools-unnamed",
        ),
    ],
)
def test_upstream_names_are_checked(upstreams: list[str], message: str) -> None:
    args = [arg for upstream in upstreams for arg in ("--upstream", upstream)]
    run = _ptc_mcp(*args)
    assert run.returncode == 2
    assert run.stdout == ""
    assert "Traceback" not in run.stderr
    [line] = run.stderr.splitlines()
    assert line.startswith(f"ptc mcp: --upstream {upstreams[-1]!r}: ")
    assert message in line
    assert leftover_children() == []


# -- named upstreams -----------------------------------------------------------------------------

NAMED = [
    "--upstream", "alpha=" + _command(CONTENT_SERVER, "alpha"),
    "--upstream", "beta=" + _command(CONTENT_SERVER, "beta"),
    "--upstream", _command(UPSTREAM_SERVER),
]  # fmt: skip


def test_named_upstreams_offer_the_same_tool_names_side_by_side(tmp_path: Path) -> None:
    """Two servers offering `read_file` (as two filesystem servers on different directories),
    named alpha and beta, beside an unnamed one whose tools keep their names. The call log
    records the names the script called (`alpha__read_file`); each upstream gets its own."""
    script = (
        "import asyncio, tools\n"
        "print(tools.alpha__read_file(path='a.txt'), tools.beta__read_file(path='b.txt'))\n"
        "both = await asyncio.gather(tools.aio.alpha__read_file(path='x'),\n"
        "                            tools.aio.beta__read_file(path='y'))\n"
        "print(both, tools.get_weather(city='Oslo')['temp_c'])\n"
        "try:\n"
        "    tools.alpha__read_file(path=1)\n"
        "except tools.InvalidArguments as exc:\n"
        "    print('invalid:', exc)\n"
    )
    db = tmp_path / "audit.db"

    async def work(session: ClientSession) -> Any:
        listed = await session.list_tools()
        called = await session.call_tool("execute_python", {"code": script})
        compact = await session.read_resource("ptc://stubs/compact")
        module = await session.read_resource("ptc://stubs/module")
        return listed, called, compact, module

    listed, called, compact, module = asyncio.run(
        asyncio.wait_for(_conversation([*NAMED, "--audit-db", str(db)], work), 120)
    )
    [tool] = listed.tools
    description = tool.description or ""
    assert "def alpha__read_file(*, path: str):" in description
    assert "def beta__snapshot():" in description
    assert "def get_weather(*, city: str)" in description
    [compact_text] = compact.contents
    assert isinstance(compact_text, mcp_types.TextResourceContents)
    assert "def beta__read_file(*, path: str):" in compact_text.text
    [module_text] = module.contents
    assert isinstance(module_text, mcp_types.TextResourceContents)
    assert "return _call('alpha__read_file', {'path': path})" in module_text.text

    assert not called.is_error, _text(called)
    text = _text(called)
    assert "alpha:a.txt beta:b.txt\n['alpha:x', 'beta:y'] 4.0\n" in text
    assert "invalid: argument 'path': expected string, got 1" in text
    assert '#1 alpha__read_file({"path":"a.txt"}) -> ok "alpha:a.txt"' in text
    assert '#2 beta__read_file({"path":"b.txt"}) -> ok "beta:b.txt"' in text

    import sqlite3

    with sqlite3.connect(db) as audit:
        tools = [row[0] for row in audit.execute("SELECT tool FROM calls ORDER BY seq")]
    assert tools == [
        "alpha__read_file",
        "beta__read_file",
        "alpha__read_file",
        "beta__read_file",
        "get_weather",
        "alpha__read_file",
    ]
    assert leftover_children() == []


# -- content beyond text -------------------------------------------------------------------------

CONTENT_SCRIPT = """\
import base64, tools
items = tools.alpha__snapshot()
print([item["type"] for item in items])
text, image, audio, notes, blob, link = items
print(text["text"])
print(image["mime_type"], base64.b64decode(image["data"])[:8], len(base64.b64decode(image["data"])))
print(audio["mime_type"], base64.b64decode(audio["data"]))
print(notes["uri"], notes["mime_type"], repr(notes["text"]), "data" in notes)
print(blob["uri"], blob["mime_type"], list(base64.b64decode(blob["data"])), "text" in blob)
print(link)
open("outputs/picture.png", "wb").write(base64.b64decode(image["data"]))
"""


def test_images_and_resources_reach_the_script_as_typed_items() -> None:
    async def work(session: ClientSession) -> Any:
        called = await session.call_tool("execute_python", {"code": CONTENT_SCRIPT})
        compact = await session.read_resource("ptc://stubs/compact")
        return called, compact

    called, compact = asyncio.run(asyncio.wait_for(_conversation(NAMED, work), 120))
    assert not called.is_error, _text(called)
    text = _text(called)
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
    expected = (
        "['text', 'image', 'audio', 'resource', 'resource', 'resource_link']\n"
        "snapshot of alpha\n"
        f"image/png {png[:8]!r} {len(png)}\n"
        "audio/wav b'RIFF\\x00\\x01'\n"
        "file:///alpha/notes.md text/markdown '# notes\\nä ✓\\n' False\n"
        "file:///alpha/data.bin None [0, 255, 1] False\n"
        "{'type': 'resource_link', 'uri': 'file:///alpha/big.csv', 'name': 'big.csv', "
        "'mime_type': 'text/csv', 'description': None}\n"
    )
    assert f"--- stdout ---\n{expected}" in text
    assert "[image content]" not in text and "[resource content]" not in text
    # The script can hand an image back to the model as an output file.
    [resource] = [b for b in called.content if isinstance(b, mcp_types.EmbeddedResource)]
    assert isinstance(resource.resource, mcp_types.BlobResourceContents)
    assert base64.b64decode(resource.resource.blob) == png

    # The stubs document the items, once, in the form the model reads.
    [compact_text] = compact.contents
    assert isinstance(compact_text, mcp_types.TextResourceContents)
    stubs = compact_text.text
    assert "class McpImage(TypedDict):" in stubs
    assert "An image; data is base64: base64.b64decode(item['data']) is its bytes." in stubs
    assert "    type: Literal['image']\n    mime_type: str\n    data: str\n" in stubs
    assert "class McpResource(TypedDict" in stubs
    assert "mime_type: str | None" in stubs
    assert "list of McpText | McpImage | McpAudio | McpResource | McpResourceLink" in stubs
    assert stubs.count("class McpImage(") == 1
    assert leftover_children() == []


def test_large_images_stay_within_the_result_cap_and_the_call_log_budget() -> None:
    """An image is a result like any other: over the call log's budget it is kept there as a
    marker (the script still gets it whole); over the broker's result cap the call fails."""
    script = (
        "import base64, tools\n"
        "[item] = tools.alpha__picture(size=200_000)\n"
        "print(item['mime_type'], len(base64.b64decode(item['data'])))\n"
        "try:\n"
        "    tools.alpha__picture(size=13_000_000)\n"
        "except tools.ToolError as exc:\n"
        "    print('too big:', exc)\n"
    )

    async def work(session: ClientSession) -> Any:
        return await session.call_tool("execute_python", {"code": script})

    # Room for the 17 MB answer to travel (about 15 s on a loaded 2-core machine): the cap is
    # what ends the call, never the clock.
    args = [*NAMED[:2], "--limit", "call_log_bytes=100000", "--limit", "wall_time=120"]
    called = asyncio.run(asyncio.wait_for(_conversation(args, work), 120))
    text = _text(called)
    assert "image/gif 200000\n" in text
    # The call log's truncation is a violation: limit_exceeded, though the script ended well.
    assert called.is_error
    assert "status: limit_exceeded · exit code 0 · 2 tool calls (1 error, 1 ok)" in text
    assert "too big: the tool's result of 17333432 bytes is over the 16777216-byte cap\n" in text
    assert (
        '#1 alpha__picture({"size":200000}) -> ok "[ptc: 266764 bytes of result not logged' in text
    )
    assert "call_log_bytes: limit 100000 bytes" in text
    assert leftover_children() == []
