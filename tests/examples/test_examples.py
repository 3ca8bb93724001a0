"""Every example under examples/ runs as documented, so none of them can rot unnoticed.

Each is started as its own process (the way a reader would run it) with a bounded time; the
test asserts the exit status and a line of the output that shows the example did its job.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable

EXAMPLES = [*sorted(p.name for p in (ROOT / "examples").glob("*_example.py")), "weather_fanout.py"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, *args], capture_output=True, text=True, cwd=ROOT, timeout=110, check=False
    )


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(name: str) -> None:
    done = _run(str(ROOT / "examples" / name))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.strip(), "an example says what it did"
    assert "Traceback" not in done.stderr


def test_the_demo_script_runs_through_ptc_run() -> None:
    done = _run(
        "-m", "sandbox.cli", "run", "examples/weather.py", "--tools", "examples/weather_tools.json"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "checked 5 cities; warmest: Paris\n"
