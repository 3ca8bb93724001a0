"""Sandbox processes are the kernel's first choice when memory runs out, the server's never:
without a memory cgroup per sandbox (the degraded process backend, the Kubernetes base), the
sandboxes' processes share the server's cgroup, and the OOM killer would otherwise take the
largest process in it, which could be the server (deploy/kubernetes/README.md, "Memory")."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.conftest import EngineHarness

SCRIPT = """
import os
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, open('/proc/self/oom_score_adj').read().encode())
    os._exit(0)
os.waitpid(pid, 0)
print(open('/proc/self/oom_score_adj').read().strip(), os.read(r, 16).decode().strip())
"""


def _score(pid: int | str) -> str:
    return Path(f"/proc/{pid}/oom_score_adj").read_text().strip()


def test_sandbox_processes_volunteer_for_the_oom_killer_and_the_server_does_not(
    clean: EngineHarness,
) -> None:
    server = _score("self")
    assert server != "1000"
    result = clean.run(SCRIPT)
    assert (str(result.status), result.stdout) == ("ok", "1000 1000\n"), result
    # The fork server itself keeps the server's score: only what it forks volunteers.
    assert clean.backend.zygote is not None
    assert {_score(pid) for pid in clean.backend.zygote.pids()} == {server}
    assert _score("self") == server
    clean.assert_healthy()
