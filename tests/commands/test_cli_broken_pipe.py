"""A reader that goes away (`ptc ... | head -c 100`) ends the command quietly, as SIGPIPE ends
other command-line tools: exit 141, nothing on stderr (no `BrokenPipeError` traceback), and no
sandbox left behind; embedded, the execution is cancelled at once rather than run to its end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.commands.test_cli_run import cli_leftovers
from tests.ptc_serve import PYTHON, ROOT, ptc_serve

pytestmark = pytest.mark.requires_bwrap

EXIT_BROKEN_PIPE = 141
FOREVER = "while True:\n    print('x' * 99)"
LINES = "for i in range(100000):\n    print(i)"


def closed_early(*args: str, script: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """`ptc *args` with ``script`` on stdin, its stdout read for 100 bytes and then closed;
    returns its exit code and stderr once it has ended."""
    with subprocess.Popen(
        [PYTHON, "-m", "sandbox.cli", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdin.write(script.encode())
        proc.stdin.close()
        assert len(proc.stdout.read(100)) == 100
        proc.stdout.close()
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
    assert cli_leftovers(proc.pid) == []
    return code, err


@pytest.fixture
def private_tmp() -> Iterator[dict[str, str]]:
    # World-traversable: the sandbox's uid must reach the runtime dir created in it.
    private = Path(tempfile.mkdtemp(prefix="clitmp-", dir="/tmp"))
    private.chmod(0o755)
    yield {"TMPDIR": str(private), "PTC_AUDIT_DB": ""}
    left = list(private.iterdir())
    shutil.rmtree(private)
    assert left == [], "ptc run left files in its TMPDIR"


@pytest.mark.parametrize("args", [["--json"], []], ids=["json", "live"])
def test_a_closed_pipe_ends_an_embedded_run_quietly(
    private_tmp: dict[str, str], args: list[str]
) -> None:
    code, err = closed_early("run", "-", *args, "--allow-degraded", script=LINES, env=private_tmp)
    assert (code, err) == (EXIT_BROKEN_PIPE, "")


def test_a_closed_pipe_cancels_the_embedded_execution(
    private_tmp: dict[str, str], tmp_path: Path
) -> None:
    """Its output has no reader left: the run is cancelled, not left to its wall-time limit
    (the audit record says which)."""
    audit = str(tmp_path / "audit.db")
    code, err = closed_early(
        "run", "-", "--allow-degraded", "--audit-db", audit, script=FOREVER, env=private_tmp
    )
    assert (code, err) == (EXIT_BROKEN_PIPE, "")
    listed = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "audit", "list", "--db", audit, "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    records = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [r["status"] for r in records] == ["cancelled"]


def test_a_closed_pipe_ends_a_served_run_quietly() -> None:
    with ptc_serve("--pool-size", "1", "--audit-db", "memory") as serving:
        for args, script in ((["--json"], LINES), ([], FOREVER)):
            code, err = closed_early("run", "-", "--server", serving.address, *args, script=script)
            assert (code, err) == (EXIT_BROKEN_PIPE, "")
        still = subprocess.run(
            [PYTHON, "-m", "sandbox.cli", "run", "-", "--server", serving.address],
            input="print('still serving')",
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
            check=False,
        )
        assert (still.returncode, still.stdout) == (0, "still serving\n"), still.stderr
