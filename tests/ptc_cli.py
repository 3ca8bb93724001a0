"""The real `ptc` command line (``python -m sandbox.cli``) in a subprocess, for every test that
drives it as a user does: which interpreter, which directory, which environment and how long,
written once instead of a helper in each test file. (`ptc serve`, which keeps running while a
test talks to it, is `tests.ptc_serve`.)"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Collection, Mapping
from pathlib import Path

__all__ = ["CLIENT_ENV", "PYTHON", "ROOT", "run_ptc"]

ROOT = Path(__file__).resolve().parents[1]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
# What points the command line at a server and authenticates it there: left out by a test that
# means the embedded engine, whatever the environment it runs in says.
CLIENT_ENV = ("PTC_SERVER", "PTC_API_KEY")


def run_ptc(
    *args: str,
    stdin: str = "",
    env: Mapping[str, str] | None = None,
    without: Collection[str] = (),
    cwd: Path = ROOT,
    timeout: float = 120.0,
    pids: list[int] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``ptc ARGS`` with ``stdin`` as its standard input, run in ``cwd`` with this process's
    environment less the names in ``without`` and with ``env`` over it. Its exit status is the
    caller's to check; past ``timeout`` seconds it is killed and `subprocess.TimeoutExpired`
    raised. ``pids``, when given, gets the process's pid (for a check of what it left behind)."""
    inherited = {k: v for k, v in os.environ.items() if k not in without}
    with subprocess.Popen(
        [PYTHON, "-m", "sandbox.cli", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env={**inherited, **(env or {})},
    ) as proc:
        if pids is not None:
            pids.append(proc.pid)
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
