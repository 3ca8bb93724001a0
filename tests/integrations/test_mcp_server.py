"""`ptc mcp` end to end: a real MCP client session (official SDK, stdio) drives `ptc mcp`, whose
tools come from an upstream MCP server written for the test (stdio); scripts call them. The
streamable-HTTP transport is driven the same way over loopback."""

from __future__ import annotations

import asyncio
import glob
import shlex
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp import types as mcp_types
from mcp.client.streamable_http import streamable_http_client

from tests.integrations.integration_support import PYTHON, UPSTREAM_SERVER, leftover_children

SCRIPT = """\
import asyncio, tools
weather = await asyncio.gather(*(tools.aio.get_weather(city=c) for c in ["Paris", "Oslo", "Lima"]))
print(sorted((w["city"], w["temp_c"]) for w in weather))
print(tools.add(a=2, b=40)["result"], tools.shout(text="hi"))
try:
    tools.get_weather(city="Atlantis")
except tools.ToolError as exc:
    print("typed:", type(exc).__name__, isinstance(exc, tools.ToolError), exc)
try:
    tools.explode()
except tools.ToolError as exc:
    print("crash:", type(exc).__name__)
"""


async def _session(work: Any) -> Any:
    upstream = shlex.join([PYTHON, str(UPSTREAM_SERVER)])
    params = StdioServerParameters(
        command=PYTHON, args=["-m", "sandbox.cli", "mcp", "--upstream", upstream]
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return await work(session)


def _text(result: Any) -> str:
    assert isinstance(result, mcp_types.CallToolResult)
    return "\n".join(b.text for b in result.content if isinstance(b, mcp_types.TextContent))


def test_ptc_mcp_runs_scripts_over_upstream_tools() -> None:
    async def work(session: ClientSession) -> Any:
        listed = await session.list_tools()
        called = await session.call_tool("execute_python", {"code": SCRIPT})
        failing = await session.call_tool(
            "execute_python", {"code": "import tools\ntools.get_weather(city='Nowhere')"}
        )
        compact = await session.read_resource("ptc://stubs/compact")
        module = await session.read_resource("ptc://stubs/module")
        return listed, called, failing, compact, module

    listed, called, failing, compact, module = asyncio.run(asyncio.wait_for(_session(work), 100))

    [tool] = listed.tools
    assert tool.name == "execute_python"
    assert tool.input_schema["required"] == ["code"]
    assert "def get_weather(*, city: str)" in (tool.description or "")
    assert "def add(*, a: int, b: int) -> AddResult:" in (tool.description or "")

    assert not called.is_error
    text = _text(called)
    assert "[('Lima', 18.0), ('Oslo', 4.0), ('Paris', 21.5)]" in text
    assert "42 HI" in text
    assert "typed: ToolError True" in text and "unknown city: Atlantis" in text
    assert "crash: ToolError" in text
    # Every forwarded call is in the call log, failures included.
    assert "7 tool calls (2 error, 5 ok)" in text
    assert '#4 add({"a":2,"b":40}) -> ok {"result":42}' in text
    assert 'get_weather({"city":"Atlantis"}) -> error' in text

    assert failing.is_error
    failing_text = _text(failing)
    assert "status: error" in failing_text and "unknown city: Nowhere" in failing_text

    [compact_text] = compact.contents
    assert isinstance(compact_text, mcp_types.TextResourceContents)
    assert "def shout(*, text: str):" in compact_text.text
    [module_text] = module.contents
    assert isinstance(module_text, mcp_types.TextResourceContents)
    assert "return _call('get_weather'" in module_text.text
    assert leftover_children() == []


def test_ptc_mcp_with_a_manifest_and_no_upstream() -> None:
    async def work(session: ClientSession) -> Any:
        return await session.call_tool("execute_python", {"code": "print(sum(range(10)))"})

    async def run() -> Any:
        params = StdioServerParameters(command=PYTHON, args=["-m", "sandbox.cli", "mcp"])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await work(session)

    result = asyncio.run(asyncio.wait_for(run(), 100))
    assert "45" in _text(result) and "status: ok" in _text(result)
    assert leftover_children() == []


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_ptc_mcp_over_streamable_http() -> None:
    """The HTTP transport, as a remote agent framework reaches it: a real `ptc mcp` process
    listening on loopback, the official SDK's streamable-HTTP client, then SIGTERM."""
    port = _free_port()
    server = subprocess.Popen(
        [PYTHON, "-m", "sandbox.cli", "mcp", "--transport", "streamable-http",
         "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "ptc mcp did not listen within 60 s"
            time.sleep(0.05)

        async def run() -> tuple[Any, Any]:
            url = f"http://127.0.0.1:{port}/mcp"
            async with (
                streamable_http_client(url) as (read, write, *_),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                listed = await session.list_tools()
                called = await session.call_tool(
                    "execute_python", {"code": "import sys\nprint(sum(range(10)))\nsys.exit(3)"}
                )
                return listed, called

        listed, called = asyncio.run(asyncio.wait_for(run(), 100))
        assert [t.name for t in listed.tools] == ["execute_python"]
        assert called.is_error  # the script exited with 3: an error result, not a transport one
        text = _text(called)
        assert "status: error · exit code 3 · 0 tool calls" in text
        assert "--- stdout ---\n45\n" in text and "SystemExit: exit code 3" in text
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=30)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
            if server.stderr is not None:
                server.stderr.close()
    assert code == 0
    assert leftover_children() == []
    # Its sandboxes' cgroups and its runtime directory went with it.
    assert glob.glob(f"/sys/fs/cgroup/**/ptc-{server.pid}-*", recursive=True) == []
    assert glob.glob(f"{tempfile.gettempdir()}/ptc-runtime-{server.pid}-*") == []


def test_ptc_mcp_refuses_a_non_loopback_host_without_tenants() -> None:
    """Like `ptc serve`: a public listener with nothing to authenticate callers never starts."""
    port = _free_port()
    run = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "mcp", "--transport", "streamable-http",
         "--host", "0.0.0.0", "--port", str(port)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stdout == ""
    assert "--host 0.0.0.0 is not a loopback address" in run.stderr
    assert "--tenants" in run.stderr
    assert leftover_children() == []


def _post(port: int, headers: dict[str, str]) -> tuple[int, dict[str, str], str]:
    import http.client
    import json

    body = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "t", "version": "0"}}}
    )  # fmt: skip
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(
            "POST",
            "/mcp",
            body=body,
            headers={
                "content-type": "application/json",
                "accept": "application/json, text/event-stream",
                **headers,
            },
        )
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        connection.close()


def test_ptc_mcp_over_http_with_tenants_needs_a_valid_bearer_key(tmp_path: Any) -> None:
    """A tenants file as for `ptc serve --tenants`: no key or a wrong key gets 401 before the MCP
    layer; a tenant's key gets a working session."""
    import hashlib

    import httpx2

    key = "ptc_test_key_for_the_mcp_http_transport_0123456789"
    tenants = tmp_path / "tenants.toml"
    digest = hashlib.sha256(key.encode()).hexdigest()
    tenants.write_text(f'[[tenant]]\nid = "acme"\nkeys = ["sha256:{digest}"]\n')
    port = _free_port()
    server = subprocess.Popen(
        [PYTHON, "-m", "sandbox.cli", "mcp", "--transport", "streamable-http",
         "--host", "127.0.0.1", "--port", str(port), "--tenants", str(tenants)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "ptc mcp did not listen within 60 s"
            time.sleep(0.05)

        status, headers, body = _post(port, {})
        assert status == 401
        assert headers["www-authenticate"] == 'Bearer realm="ptc-mcp"'
        assert "missing metadata 'authorization: Bearer <API key>'" in body
        status, _, body = _post(port, {"authorization": "Bearer ptc_wrong"})
        assert (status, "unknown API key" in body) == (401, True)
        status, _, body = _post(port, {"authorization": f"Basic {key}"})
        assert status == 401
        status, _, body = _post(port, {"authorization": f"Bearer {key}"})
        assert status == 200 and '"serverInfo"' in body

        async def run() -> Any:
            client = httpx2.AsyncClient(headers={"authorization": f"Bearer {key}"})
            async with (
                client,
                streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=client) as (
                    read,
                    write,
                    *_,
                ),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                return await session.call_tool("execute_python", {"code": "print(6 * 7)"})

        called = asyncio.run(asyncio.wait_for(run(), 100))
        assert not called.is_error
        assert "--- stdout ---\n42" in _text(called)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=30)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
            if server.stderr is not None:
                server.stderr.close()
    assert code == 0
    assert leftover_children() == []


def test_ptc_mcp_returns_output_files_as_embedded_resources() -> None:
    code = (
        "import os\n"
        "open('outputs/chart.png', 'wb').write(bytes(range(256)))\n"
        "os.symlink('/etc/passwd', 'outputs/passwd')\n"
    )

    async def work(session: ClientSession) -> Any:
        return await session.call_tool("execute_python", {"code": code})

    called = asyncio.run(asyncio.wait_for(_session(work), 100))
    assert not called.is_error
    text = _text(called)
    assert "--- output files ---" in text
    assert "outputs/chart.png: 256 bytes, sha256 " in text
    assert "outputs/passwd: not returned (symlink" in text
    [resource] = [b for b in called.content if isinstance(b, mcp_types.EmbeddedResource)]
    assert isinstance(resource.resource, mcp_types.BlobResourceContents)
    assert resource.resource.uri.startswith("ptc://outputs/")
    assert resource.resource.uri.endswith("/chart.png")
    assert resource.resource.mime_type == "image/png"
    import base64

    assert base64.b64decode(resource.resource.blob) == bytes(range(256))
