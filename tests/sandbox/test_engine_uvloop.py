"""The engine embedded in an application that runs on uvloop, as `ptc serve` does.

uvloop's `add_writer` puts a file in O_NONBLOCK mode for its poll handle. The channel's host end
is written by the loop (a large reply's backlog is flushed by a writer callback) while its thread
reads it with blocking reads; once the loop had flushed a backlog, the thread's next read failed
with EAGAIN and the channel closed under the guest (`NoReport`). Megabyte tool answers make the
loop flush a backlog on every call."""

from __future__ import annotations

import json

import uvloop

from sandbox.engine import Engine, EngineConfig, ExecutionRequest
from sandbox.result import ExecutionResult

ECHO = json.dumps(
    [{"name": "echo", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}]
)
SCRIPT = """
import tools
sizes = [len(tools.echo(text=str(i) * 1_000_000)["text"]) for i in range(3)]
print(sizes)
"""


async def _run() -> ExecutionResult:
    engine = Engine(EngineConfig())
    await engine.start()
    try:
        return await engine.execute(ExecutionRequest(script=SCRIPT, manifest=ECHO))
    finally:
        await engine.close()


def test_megabyte_tool_answers_on_uvloop() -> None:
    result = uvloop.run(_run())
    assert (str(result.status), result.stdout, result.error) == (
        "ok",
        "[1000000, 1000000, 1000000]\n",
        None,
    ), result
    assert len(result.calls) == 3
