"""The host starts its fork server (and probes bwrap) without running the process's fork
handlers, so a library that breaks fork(2) children cannot stop it.

gRPC's event engine restarts its poller thread in every fork(2) child through a
`pthread_atfork` handler; `subprocess` then closes the child's descriptors before `exec`, the
poller's `epoll_wait` fails with EBADF and gRPC aborts the child (grpc/grpc#43055). A server
whose zygote was started that way failed with "the fork server did not start: ...
Epoll1Poller ... Bad file descriptor". Python's `subprocess` takes vfork(2), which runs no
fork handlers, only when it changes no user or group in the child, so the host passes no
`user=`/`group=` (which would force fork(2)), even as root.

Here the child process registers a fork handler that aborts every fork(2) child (harsher than
gRPC's race, and certain), checks that it does, then starts the process backend, replaces its
zygote twice (fork budget 2) and runs scripts: all of it must work.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.requires_bwrap

SCRIPT = r"""
import asyncio, ctypes, json, os, subprocess, sys
sys.path.insert(0, sys.argv[1])

libc = ctypes.CDLL(None)
# A fork handler that kills every child of fork(2) before it can exec (what gRPC's restarted
# poller does by accident). vfork(2) runs no fork handlers. (`pthread_atfork` itself is linked
# statically into each program; glibc exports what it calls.)
abort = ctypes.cast(libc.abort, ctypes.c_void_p)
assert getattr(libc, "__register_atfork")(None, None, abort, None) == 0
forked = subprocess.run(["/bin/true"], preexec_fn=lambda: None, check=False).returncode

from sandbox.backends.factory import build_backend
from sandbox.backends.process.backend import ProcessBackendConfig
from sandbox.engine import Engine, EngineConfig, ExecutionRequest


async def main() -> list[list[object]]:
    backend = build_backend("process", ProcessBackendConfig(pool_size=1, zygote_max_forks=2))
    engine = Engine(EngineConfig(backends={"process": backend}))
    await engine.start()
    try:
        runs = []
        for n in range(5):
            result = await engine.execute(ExecutionRequest(script=f"print({n} * 7)"))
            runs.append([result.status, result.stdout])
        runs.append(["generations", backend.zygote.generations])
        return runs
    finally:
        await engine.close()


print(json.dumps({"forked": forked, "runs": asyncio.run(main())}))
"""


def test_the_fork_server_starts_where_fork_handlers_kill_fork_children() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout)
    # The handler works: a child of fork(2) dies of SIGABRT before its exec.
    assert out["forked"] == -6, out
    runs = out["runs"]
    assert runs[:5] == [["ok", f"{n * 7}\n"] for n in range(5)], (runs, done.stderr[-4000:])
    # Five executions on a budget of two forks per zygote: the zygote was replaced (started
    # anew, under the same fork handler) at least twice.
    assert runs[5][0] == "generations" and runs[5][1] >= 3, runs
