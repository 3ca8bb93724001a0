"""The integrations record through the one recorder: `EmbeddedRunner(audit=...)` and
`ptc mcp --audit-db` leave the same audit records as the server (admitted, then completed, with
every call and the effective limits in the proto's units). Real SQLite files, the real process
backend, `ptc mcp` driven by the official MCP client over stdio."""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters, stdio_client

from sandbox.audit import AuditQuery, open_store
from sandbox.backends.factory import BackendOptions, build_backend
from sandbox.engine import EngineConfig
from sandbox.integrations import EmbeddedRunner, ExecuteTool
from sandbox.limits import Limits
from tests.integrations.integration_support import (
    PYTHON,
    UPSTREAM_SERVER,
    get_weather,
    leftover_children,
)

ROOT = Path(__file__).resolve().parents[2]


def _records(db: Path) -> list[Any]:
    store = open_store(db)
    try:
        assert store.verify().ok
        return store.list("default", AuditQuery())[0]
    finally:
        store.close()


def test_embedded_runner_records_each_execution(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    backend = build_backend("process", BackendOptions(pool_size=1))
    runner = EmbeddedRunner(EngineConfig(backends={"process": backend}), audit=str(db))
    try:
        execute = ExecuteTool(runner, [get_weather], limits=Limits(wall_time_ms=3000))
        observation = execute.run("import tools\nprint(tools.get_weather(city='Oslo')['temp_c'])")
    finally:
        runner.close()
    assert observation.result is not None and observation.result.stdout == "12.0\n"
    [record] = _records(db)
    assert record.status == "ok"
    assert record.admission.execution_id == observation.result.execution_id
    assert record.admission.effective_limits is not None
    assert record.admission.effective_limits.wall_time_ms == 3000
    assert record.result is not None
    assert [(c.tool, c.arguments, c.status) for c in record.result.calls] == [
        ("get_weather", {"city": "Oslo"}, "ok")
    ]
    assert leftover_children() == []


def test_ptc_mcp_audit_db_records_each_execution(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    upstream = shlex.join([PYTHON, str(UPSTREAM_SERVER)])
    params = StdioServerParameters(
        command=PYTHON,
        args=["-m", "sandbox.cli", "mcp", "--upstream", upstream, "--audit-db", str(db)],
        cwd=str(ROOT),
    )

    async def work() -> Any:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await session.call_tool(
                "execute_python", {"code": "import tools\nprint(tools.add(a=2, b=40))"}
            )

    called = asyncio.run(asyncio.wait_for(work(), 100))
    assert not called.is_error
    [record] = _records(db)
    assert record.status == "ok"
    assert record.result is not None and record.result.stdout == "{'result': 42}\n"
    assert [(c.tool, c.status) for c in record.result.calls] == [("add", "ok")]
