"""Run by tests/backends/test_enclosing_oom.py inside a memory-limited cgroup, as a server in a
pod whose limit is smaller than its sandboxes together: a degraded process backend (no cgroups
of its own) runs the script given on stdin under the limits given as arguments, then a plain
`print(1)`, and prints both results as one JSON line each."""

from __future__ import annotations

import asyncio
import json
import sys

from sandbox.backends.factory import build_backend
from sandbox.backends.process.backend import ProcessBackendConfig
from sandbox.engine import Engine, EngineConfig, ExecutionRequest
from sandbox.limits import parse_limit_args


async def main(script: str, limits: list[str]) -> None:
    config = ProcessBackendConfig(pool_size=1, allow_degraded=True, cgroups=False)
    engine = Engine(EngineConfig(backends={"process": build_backend("process", config)}))
    await engine.start()
    try:
        for source, given in ((script, limits), ("print(1)", [])):
            request = ExecutionRequest(script=source, limits=parse_limit_args(given))
            result = await engine.execute(request)
            print(json.dumps(result.to_json()), flush=True)
    finally:
        await engine.close()


if __name__ == "__main__":
    asyncio.run(main(sys.stdin.read(), sys.argv[1:]))
