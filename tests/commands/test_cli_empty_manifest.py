"""A manifest file of zero bytes (a redirect that failed) is an error naming the file, in every
command that reads one; `[]` stays a valid manifest with no tools."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ptc_cli import run_ptc

EMPTY = "the manifest is empty (0 bytes); a manifest with no tools is written []"


@pytest.fixture
def empty(tmp_path: Path) -> Path:
    path = tmp_path / "tools.json"
    path.write_bytes(b"")
    return path


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        pytest.param(("run", "-", "--allow-degraded"), "--tools", id="run"),
        pytest.param(("run", "-", "--server", "127.0.0.1:9"), "--tools", id="run-server"),
        pytest.param(("replay", "x", "--audit-db", "memory"), "--tools", id="replay"),
        pytest.param(("session", "create", "--server", "127.0.0.1:9"), "--tools", id="session"),
        pytest.param(("mcp",), "--tools", id="mcp"),
    ],
)
def test_an_empty_tools_file_is_refused_naming_it(
    empty: Path, command: tuple[str, ...], flag: str
) -> None:
    done = run_ptc(*command, flag, str(empty), stdin="print(1)", without=("PTC_AUDIT_DB",))
    name = command[0]
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"ptc {name}: {flag} {empty}: {EMPTY}\n"
    assert done.stdout == ""


def test_stubs_refuses_an_empty_file_and_empty_standard_input(empty: Path) -> None:
    done = run_ptc("stubs", str(empty))
    assert (done.returncode, done.stderr) == (2, f"ptc stubs: MANIFEST {empty}: {EMPTY}\n")
    done = run_ptc("stubs", "-", stdin="")
    assert (done.returncode, done.stderr) == (2, f"ptc stubs: MANIFEST standard input: {EMPTY}\n")


def test_whitespace_only_is_empty_too(tmp_path: Path) -> None:
    path = tmp_path / "tools.json"
    path.write_text("\n  \n")
    done = run_ptc("stubs", str(path))
    assert done.returncode == 2
    assert done.stderr == (
        f"ptc stubs: MANIFEST {path}: the manifest is empty (4 bytes of whitespace only);"
        " a manifest with no tools is written []\n"
    )


@pytest.mark.requires_bwrap
def test_an_empty_array_stays_valid(tmp_path: Path) -> None:
    path = tmp_path / "tools.json"
    path.write_text("[]")
    done = run_ptc(
        "run", "-", "--tools", str(path), "--allow-degraded", "--json", stdin="print(6 * 7)",
        without=("PTC_AUDIT_DB",),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert '"stdout": "42\\n"' in done.stdout
    assert run_ptc("stubs", str(path)).returncode == 0
