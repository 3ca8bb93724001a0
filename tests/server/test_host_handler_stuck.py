"""Host handlers that never end, through a real `ptc serve`: the execution ends under its own
limits with the call recorded as cancelled, the server goes on serving, and its stop ends (exit
0, within the helper's bound) and says what it left behind.

Both were real: a plain function blocked in ``time.sleep(3600)`` kept the process after SIGTERM
for the hour (the loop's default executor joined its thread at exit), and a coroutine that
catches its CancelledError kept its execution past its wall time, the drain with it, and then
`asyncio.run`'s own clean-up, for ever."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from pathlib import Path

import pytest

from sandbox.client import Client
from sandbox.result import ExecutionResult
from tests.ptc_serve import ptc_serve
from tests.server.server_support import manifest

pytestmark = pytest.mark.requires_bwrap

HANDLERS = (
    "--host-handler",
    "blocks=tests.server.ptc_test_host_tools:blocks",
    "--host-handler",
    "ignores_cancel=tests.server.ptc_test_host_tools:ignores_cancel",
)
TOOLS = manifest(
    ("blocks", "host", {"mark": {"type": "string"}}),
    ("ignores_cancel", "host", {"mark": {"type": "string"}}),
)


def _wait_for(mark: Path, future: concurrent.futures.Future[ExecutionResult]) -> None:
    """Until the handler says it runs (bounded: a test that never gets there fails here)."""
    for _ in range(600):
        if mark.exists():
            return
        if future.done():
            raise AssertionError(f"the execution ended before its handler ran: {future.result()}")
        time.sleep(0.05)
    raise AssertionError("the host handler never started")


def _the_call(result: ExecutionResult, tool: str) -> None:
    assert [(c.tool, c.status) for c in result.calls] == [(tool, "cancelled")], result.calls
    assert result.calls[0].error == "the execution ended before the call completed"


def test_a_blocking_handler_does_not_hold_the_servers_exit(tmp_path: Path) -> None:
    mark = tmp_path / "started"
    script = f"import tools\nprint(tools.blocks(mark={str(mark)!r}))"
    with (
        ptc_serve("--audit-db", "memory", "--grace", "1", *HANDLERS, stop_timeout_s=30) as serving,
        Client(serving.address) as client,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        future = pool.submit(client.execute, script, TOOLS, limits={"wall_time": 600})
        _wait_for(mark, future)
        os.kill(serving.pid, signal.SIGTERM)  # the stop the helper then waits for
        result = future.result(timeout=30)
    assert result.status == "interrupted", result
    _the_call(result, "blocks")
    assert "host handlers: 1 calls still run at shutdown and are left behind" in serving.stderr
    assert "blocks for " in serving.stderr


def test_a_handler_that_ignores_its_cancel_ends_with_its_execution(tmp_path: Path) -> None:
    mark = tmp_path / "started"
    script = f"import tools\nprint(tools.ignores_cancel(mark={str(mark)!r}))"
    with (
        ptc_serve("--audit-db", "memory", *HANDLERS, stop_timeout_s=30) as serving,
        Client(serving.address) as client,
    ):
        result = client.execute(script, TOOLS, limits={"wall_time": 1}, timeout=30)
        assert mark.exists()
        assert result.status == "limit_exceeded", result
        assert [(v.limit, v.action) for v in result.violations] == [("wall_time", "killed")]
        _the_call(result, "ignores_cancel")
        assert client.execute("print(1)").stdout == "1\n"  # still serving
    stderr = serving.stderr
    assert (
        f"execution {result.execution_id}: 1 tasks did not end within 2.0 s of their cancel and"
        " are abandoned (tool calls: ignores_cancel)"
    ) in stderr, stderr
    # At exit the abandoned task still runs: it gets its bound again, and is left.
    assert "1 tasks did not end within 5.0 s of their cancel at exit and are left" in stderr


def test_a_call_that_never_got_a_thread_says_so(tmp_path: Path) -> None:
    """With every handler thread held by a hung call, the next call times out without having
    run, and its error says that, not only that it "took longer"."""
    config = tmp_path / "server.toml"
    config.write_text("[host_handler_limits]\ntimeout_s = 1\nconcurrency = 1\n")
    mark = tmp_path / "started"
    script = (
        "import tools\n"
        "for _ in range(2):\n"
        "    try:\n"
        f"        tools.blocks(mark={str(mark)!r})\n"
        "    except tools.ToolError as e:\n"
        "        print(e)\n"
    )
    with (
        ptc_serve("--audit-db", "memory", "--config", str(config), *HANDLERS) as serving,
        Client(serving.address) as client,
    ):
        result = client.execute(script, TOOLS, timeout=60)
        assert client.execute("print(1)").stdout == "1\n"
    assert result.status == "ok", result
    first, second = result.stdout.splitlines()
    assert first == "the host handler for 'blocks' took longer than 1 s"
    assert second.startswith(
        "the host handler for 'blocks' took longer than 1 s: it never started, all 1 host "
        "handler threads run earlier calls; the longest: 'blocks', for "
    ), second
    assert [c.status for c in result.calls] == ["error", "error"]
    assert "host handlers: 1 calls still run at shutdown and are left behind" in serving.stderr
