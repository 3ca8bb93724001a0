"""`ptc serve` as a real process: prints its address, serves `ptc run --server`, and on SIGTERM
stops in-flight executions after the grace (the client sees `interrupted`), drains its pool and exits 0 with no
sandbox process left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from sandbox.client import Client
from tests.ptc_serve import start_serve

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable


def _start_server(*extra: str) -> tuple[subprocess.Popen[str], str]:
    if "--audit-db" not in extra:
        extra = ("--audit-db", "memory", *extra)
    proc, serving = start_serve("--pool-size", "2", *extra)
    return proc, serving.address


def _descendants(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def test_run_through_server_and_clean_sigterm(tmp_path):
    proc, address = _start_server("--grace", "0.5")
    try:
        (tmp_path / "m.json").write_text(
            json.dumps(
                [
                    {
                        "name": "echo_it",
                        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
                    }
                ]
            )
        )
        done = subprocess.run(
            [
                PYTHON,
                "-m",
                "sandbox.cli",
                "run",
                "-",
                "--server",
                address,
                "--json",
                "--tools",
                str(tmp_path / "m.json"),
            ],
            input="import tools\nprint(tools.echo_it(a=1))",
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert (out["status"], out["stdout"]) == ("ok", "{'a': 1}\n")
        assert out["calls"][0]["tool"] == "echo_it"

        with Client(address) as client:
            execution = client.stream("import time\nprint('go', flush=True)\ntime.sleep(60)")
            next(iter(execution))  # the script is running
            sandboxes = _descendants(proc.pid)
            assert sandboxes
            proc.send_signal(signal.SIGTERM)
            result = execution.result(timeout=30)
        assert result.status == "interrupted"
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stderr = proc.stderr.read() if proc.stderr else ""
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    for pid in sandboxes:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert "Traceback" not in stderr, stderr


def test_bad_address_is_a_clear_error():
    done = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "run", "-", "--server", "127.0.0.1:1"],
        input="print(1)",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
        env={**os.environ},
    )
    assert done.returncode == 12  # Unavailable, not a bad request
    assert done.stderr.startswith("ptc run: unavailable: server 127.0.0.1:1: "), done.stderr
    time.sleep(0)
