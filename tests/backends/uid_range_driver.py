"""Run by tests/backends/test_uid_per_sandbox.py as root with only the capabilities the
Kubernetes base grants (SYS_ADMIN, SETUID, SETGID, KILL: no DAC_OVERRIDE): a degraded process
backend starts, two sandboxes are taken at once, and one JSON line says the uids /proc shows for
each one's pid 1 (real, effective, saved, filesystem) and the range the backend gives."""

from __future__ import annotations

import asyncio
import json

from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig
from sandbox.backends.process.sandbox import ProcessSandbox
from sandbox.limits import DEFAULTS


def _uids(pid: int) -> list[int]:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("Uid:"))
    return [int(value) for value in line.split()[1:]]


async def main() -> None:
    backend = ProcessBackend(
        ProcessBackendConfig(pool_size=0, allow_degraded=True, cgroups=False, exit_status="pidfd")
    )
    await backend.start()
    try:
        first = await backend.acquire(DEFAULTS)
        second = await backend.acquire(DEFAULTS)
        assert isinstance(first, ProcessSandbox) and isinstance(second, ProcessSandbox)
        uids = backend.uids
        print(
            json.dumps(
                {
                    "range": None if uids is None else [uids.range.first, uids.range.count],
                    "pid1_uids": [_uids(first.pid), _uids(second.pid)],
                }
            )
        )
        for handle in (first, second):
            await handle.dispose()
    finally:
        await backend.close()


if __name__ == "__main__":
    asyncio.run(main())
