"""The leftover check itself: `EngineHarness.leftovers()` reports what this process's executions
left behind and nothing that other processes on the machine put under the same `/tmp/ptc-*`
prefix (other test runs, servers and benchmarks use it at the same time)."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox.backends.process.runtime_dir import make_runtime_dir
from sandbox.handlers import ToolCall

if TYPE_CHECKING:
    from tests.conftest import EngineHarness

MAKE = {
    "name": "make",
    "description": "Has another process create an unrelated /tmp/ptc-* entry.",
    "parameters": {"type": "object", "properties": {}},
    "x-ptc": {"mode": "host"},
}


def _unrelated_name() -> Path:
    # Hex never equals our pid as a whole `-` part unless it is all digits: draw until it is not.
    while True:
        token = secrets.token_hex(6)
        if token != str(os.getpid()):
            return Path("/tmp") / f"ptc-unrelated-{token}"


def test_unrelated_tmp_entry_is_ignored_and_own_leftovers_are_reported(
    harness: EngineHarness,
) -> None:
    unrelated = _unrelated_name()

    async def make(call: ToolCall) -> Any:
        # Another process creates it while the execution runs.
        proc = await asyncio.create_subprocess_exec("mkdir", str(unrelated))
        return await proc.wait()

    try:
        result = harness.run(
            "import tools\nprint(tools.make())", manifest=[MAKE], handlers={"host": make}
        )
        assert (result.status, result.stdout, unrelated.is_dir()) == ("ok", "0\n", True)
        assert harness.leftovers() == []

        # Real leftovers of this process: a second runtime dir named after it (what a backend
        # that was never closed leaves) and a file in its backend's runtime dir.
        stray_dir = make_runtime_dir()
        stray_file = harness.runtime_dir / "stray"
        try:
            stray_file.write_text("left behind")
            assert harness.leftovers() == [
                f"temporary entry {stray_dir}",
                f"runtime dir entry {stray_file}",
            ]
        finally:
            shutil.rmtree(stray_dir)
            stray_file.unlink(missing_ok=True)
        assert unrelated.is_dir()
        assert harness.leftovers() == []
    finally:
        shutil.rmtree(unrelated, ignore_errors=True)
