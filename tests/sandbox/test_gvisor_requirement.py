"""The gVisor tier cannot drop out of CI unnoticed: a `requires_gvisor` test is skipped, with the
reason, where runsc cannot run, but fails with that reason when ``PTC_REQUIRE_GVISOR=1`` (which
scripts/test.sh sets). Run as a real pytest in a subprocess, on a real conformance test, with
the engine address pointed at a socket that does not exist (or, for the passing case, at the
real engine)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
GVISOR_TEST = "tests/conformance/test_conformance_basics.py::test_output_on_both_streams[gvisor]"
NOWHERE = "unix:///nonexistent/ptc-no-docker.sock"


def _pytest(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs", GVISOR_TEST],
        capture_output=True, text=True, cwd=ROOT, timeout=110, check=False, env=env,
    )  # fmt: skip


def _env(docker_host: str | None, require: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PTC_REQUIRE_GVISOR"}
    if docker_host is not None:
        env["PTC_DOCKER_HOST"] = env["DOCKER_HOST"] = docker_host
    if require is not None:
        env["PTC_REQUIRE_GVISOR"] = require
    return env


@pytest.mark.parametrize("require", [None, "0"], ids=["unset", "zero"])
def test_without_gvisor_the_test_is_skipped_with_the_reason(require: str | None) -> None:
    done = _pytest(_env(NOWHERE, require))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("1 skipped in "), done.stdout
    assert (
        "SKIPPED [1] tests/conftest.py: requires_gvisor: docker backend unavailable: "
        + (f"no Docker engine answers at {NOWHERE} ")
        in done.stdout
    )


def test_without_gvisor_a_required_test_fails_with_the_reason() -> None:
    done = _pytest(_env(NOWHERE, "1"))
    assert done.returncode == 1, done.stdout + done.stderr
    # Failed at set-up, before any fixture started a backend: an error, not a skip.
    assert done.stdout.splitlines()[-1].startswith("1 error in "), done.stdout
    assert f"ERROR {GVISOR_TEST}" in done.stdout
    assert (
        "\nPTC_REQUIRE_GVISOR=1 but gVisor is unavailable: docker backend unavailable: "
        f"no Docker engine answers at {NOWHERE} "
    ) in done.stdout


@pytest.mark.requires_gvisor
def test_with_gvisor_a_required_test_runs() -> None:
    done = _pytest(_env(None, "1"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("1 passed in "), done.stdout


def test_the_test_command_requires_gvisor() -> None:
    lines = (ROOT / "scripts" / "test.sh").read_text().splitlines()
    pytest_line = next(i for i, line in enumerate(lines) if "-m pytest" in line)
    assert "export PTC_REQUIRE_GVISOR=1" in lines[:pytest_line]
