"""Live progress on every path: `Progress` events in the client SDK (over ExecuteStream),
`ptc run`'s status line on a terminal (embedded and with `--server`), and the MCP execute tool's
progress notifications (a real MCP client session over stdio)."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters, stdio_client

from sandbox.client import Progress
from tests.telemetry.telemetry_support import PYTHON, ROOT, InProcessServer, echo_manifest

LONG_SCRIPT = (
    "import time, tools\n"
    "print('first', flush=True)\n"
    "tools.lookup(x=1)\n"
    "tools.lookup(x=2)\n"
    "time.sleep(2.6)\n"
    "print('second')\n"
)


def test_client_sdk_gets_progress_events(server: InProcessServer) -> None:
    seen: list[Progress] = []
    result = server.client.run(LONG_SCRIPT, echo_manifest("lookup"), on_progress=seen.append)
    assert (result.status, result.stdout) == ("ok", "first\nsecond\n")
    assert 1 <= len(seen) <= 3, seen
    assert [p.tool_calls for p in seen] == [2] * len(seen)
    assert [p.stdout_bytes for p in seen] == [len("first\n")] * len(seen)
    elapsed = [p.elapsed_s for p in seen]
    assert elapsed == sorted(elapsed)
    assert 0.9 <= elapsed[0] < result.usage.wall_time_s + 0.5
    # A short run sends none.
    quick: list[Progress] = []
    assert server.client.run("print(1)", on_progress=quick.append).status == "ok"
    assert quick == []


def test_sync_stream_keeps_the_latest_progress(server: InProcessServer) -> None:
    seen: list[Progress] = []
    execution = server.client.stream(LONG_SCRIPT, echo_manifest("lookup"), on_progress=seen.append)
    chunks = b"".join(chunk.data for chunk in execution)
    result = execution.result(60)
    assert (result.status, chunks) == ("ok", b"first\nsecond\n")
    assert seen and execution.progress == seen[-1]
    assert execution.progress.tool_calls == 2


def _on_terminal(args: list[str], script: str, tmp_path: Path) -> tuple[int, str]:
    """Runs `ptc ARGS` with stdout and stderr on a pseudo-terminal; returns (exit, screen)."""
    (tmp_path / "script.py").write_text(script)
    (tmp_path / "tools.json").write_text(echo_manifest("lookup"))
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "sandbox.cli",
            *args,
            str(tmp_path / "script.py"),
            "--tools",
            str(tmp_path / "tools.json"),
        ],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    screen = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the terminal closed: the program ended
                break
            if not data:
                break
            screen += data
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(10), screen.decode("utf-8", "replace")


STATUS = re.compile(r"\r\x1b\[2K\[ptc\] (\d+\.\d)s of 10s · 2 of 1000 tool calls")


def test_ptc_run_shows_output_as_it_arrives_and_a_status_line(tmp_path: Path) -> None:
    code, screen = _on_terminal(["run"], LONG_SCRIPT, tmp_path)
    assert code == 0, screen
    first, status, second = screen.find("first"), STATUS.search(screen), screen.find("second")
    assert status is not None, screen
    # Output first as it came, then the status line while the script slept, then the rest,
    # with the status line erased before it.
    assert 0 <= first < status.start() < second, screen
    assert float(status.group(1)) >= 1.0
    assert "\r\x1b[2K" in screen[status.end() : second]
    assert "── status: ok" in screen


def test_ptc_run_on_a_server_shows_the_servers_progress(
    server: InProcessServer, tmp_path: Path
) -> None:
    code, screen = _on_terminal(["run", "--server", server.address], LONG_SCRIPT, tmp_path)
    assert code == 0, screen
    status = re.search(r"\r\x1b\[2K\[ptc\] (\d+\.\d)s · 2 tool calls", screen)
    assert status is not None, screen
    assert screen.find("first") < status.start() < screen.find("second")


def test_ptc_run_json_has_no_status_line(tmp_path: Path) -> None:
    code, screen = _on_terminal(["run", "--json"], LONG_SCRIPT, tmp_path)
    assert code == 0, screen
    assert "[ptc]" not in screen
    assert json.loads(screen.strip())["stdout"] == "first\nsecond\n"


def test_mcp_execute_tool_sends_progress_notifications(tmp_path: Path) -> None:
    (tmp_path / "tools.json").write_text(echo_manifest("lookup"))
    params = StdioServerParameters(
        command=PYTHON,
        args=["-m", "sandbox.cli", "mcp", "--tools", str(tmp_path / "tools.json")],
        cwd=str(ROOT),
    )
    notes: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append((progress, total, message))

    async def main() -> Any:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await session.call_tool(
                "execute_python", {"code": LONG_SCRIPT}, progress_callback=on_progress
            )

    result = asyncio.run(asyncio.wait_for(main(), 60))
    assert not result.is_error
    assert "first\nsecond" in result.content[0].text
    assert 1 <= len(notes) <= 3, notes
    progress = [p for p, _, _ in notes]
    assert progress == sorted(progress) and progress[0] >= 1.0
    for _, total, message in notes:
        assert total is None
        assert message is not None
        assert re.fullmatch(r"\[ptc\] \d+\.\ds · 2 tool calls( · .*)?", message), message
