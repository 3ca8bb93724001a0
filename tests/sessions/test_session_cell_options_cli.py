"""Every option of `ptc run` on a session cell (`--session`, through a real `ptc serve`): it
applies exactly as on a single-use run (`--policy`, `--expect`, `--file`, `--limit`,
`--outputs-dir`, `--tools`, `--json`), or it is refused with an error naming it (a backend or
runtime other than the session's, with the session's; a limit of the session's whole sandbox;
the embedded-only `--audit-db` and `--allow-degraded` with any `--server`). Nothing is ignored.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ptc_cli import CLIENT_ENV, run_ptc
from tests.ptc_serve import PYTHON, ROOT, ptc_serve

LOOKUP = [
    {
        "name": "lookup",
        "description": "Finds a thing.",
        "parameters": {"type": "object", "properties": {"q": {"type": "integer"}}},
    }
]
RESTRICTED_ESCAPE = "x = 1\nprint(getattr(x, 'real'))"


def ptc(*args: str, stdin: str = "", cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return run_ptc(*args, stdin=stdin, cwd=cwd, without=(*CLIENT_ENV, "PTC_AUDIT_DB"))


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    with ptc_serve("--pool-size", "1", "--audit-db", "memory") as serving:
        yield serving.address


@pytest.fixture
def session(address: str, tmp_path: Path) -> Iterator[str]:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(LOOKUP))
    created = ptc("session", "create", "--server", address, "--tools", str(tools))
    assert created.returncode == 0, created.stderr
    sid = created.stdout.strip()
    yield sid
    closed = ptc("session", "close", sid, "--server", address)
    assert closed.returncode == 0, closed.stderr


def cell(address: str, sid: str, script: str, *args: str) -> tuple[int, dict[str, Any], str]:
    done = ptc("run", "-", "--json", "--server", address, "--session", sid, *args, stdin=script)
    out = json.loads(done.stdout) if done.stdout else {}
    return done.returncode, out, done.stderr


def single(address: str, script: str, *args: str) -> tuple[int, dict[str, Any], str]:
    done = ptc("run", "-", "--json", "--server", address, *args, stdin=script)
    out = json.loads(done.stdout) if done.stdout else {}
    return done.returncode, out, done.stderr


def test_policy_restricted_applies_to_a_cell_as_to_a_single_run(address: str, session: str) -> None:
    code, out, _ = cell(address, session, RESTRICTED_ESCAPE, "--policy", "restricted")
    single_code, single_out, _ = single(address, RESTRICTED_ESCAPE, "--policy", "restricted")
    assert (code, out["status"], out["stdout"]) == (4, "rejected", "")
    assert out["error"] == single_out["error"]
    assert single_code == 4
    assert "getattr" in out["error"]["message"]
    # Without the option the same cell runs: the policy was what refused it.
    code, out, _ = cell(address, session, RESTRICTED_ESCAPE)
    assert (code, out["status"], out["stdout"]) == (0, "ok", "1\n")


def test_expect_files_limits_and_outputs_apply_to_a_cell(
    address: str, session: str, tmp_path: Path
) -> None:
    script = "import tools\ntools.lookup(q=1)"
    code, out, _ = cell(address, session, script, "--expect", "lookup=2:3")
    assert code == 3
    assert [(v["limit"], v["observed"]) for v in out["violations"]] == [("expected_calls", 1)]
    single_code, single_out, _ = single(
        address, script, "--expect", "lookup=2:3", "--tools", _tools(tmp_path)
    )
    assert (single_code, single_out["violations"]) == (code, out["violations"])

    data = tmp_path / "data.txt"
    data.write_text("from the host")
    code, out, _ = cell(
        address, session, "print(open('in.txt').read())", "--file", f"{data}=in.txt"
    )
    assert (code, out["stdout"]) == (0, "from the host\n")

    code, out, _ = cell(address, session, "import time\ntime.sleep(30)", "--limit", "wall_time=1")
    assert code == 3  # a cell is interrupted, not killed: the session lives on
    assert [(v["limit"], v["action"]) for v in out["violations"]] == [("wall_time", "interrupted")]

    saved = tmp_path / "saved"
    code, out, _ = cell(
        address,
        session,
        "open('outputs/a.txt', 'w').write('made in a cell')",
        "--outputs-dir",
        str(saved),
    )
    assert code == 0, out
    assert (saved / "a.txt").read_text() == "made in a cell"


def _tools(tmp_path: Path) -> str:
    path = tmp_path / "single-tools.json"
    path.write_text(json.dumps(LOOKUP))
    return str(path)


def test_a_backend_or_runtime_other_than_the_sessions_is_refused_naming_it(
    address: str, session: str
) -> None:
    code, _, err = cell(address, session, "print(1)", "--backend", "docker")
    assert code == 2
    assert err.strip().endswith(
        f"server {address}: backend: session '{session}' runs on 'process', not 'docker'"
    )
    code, _, err = cell(address, session, "print(1)", "--runtime", "np")
    assert code == 2
    assert err.strip().endswith(
        f"server {address}: runtime: session '{session}' runs in the standard library, not "
        "'np'; a session's runtime is chosen at CreateSession"
    )
    # The session's own backend, named explicitly, is no conflict.
    code, out, _ = cell(address, session, "print(1)", "--backend", "process")
    assert (code, out["status"], out["backend"]) == (0, "ok", "process")


@pytest.mark.parametrize("name", ["memory", "processes", "file_size", "open_files"])
def test_a_limit_of_the_whole_session_is_refused_on_a_cell(
    address: str, session: str, name: str
) -> None:
    code, out, err = cell(address, session, "print(1)", "--limit", f"{name}=100000")
    assert (code, out) == (2, {})
    assert err.startswith(
        f"ptc run: --limit {name}: a session's {name} is set for its whole sandbox by "
        "`ptc session create --limit`, not per cell"
    )


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (
            ["--audit-db", "x.db"],
            "ptc run: --audit-db: the server records its executions in its own audit store; "
            "not with --server",
        ),
        (
            ["--allow-degraded"],
            "ptc run: --allow-degraded: the server decides its isolation (`ptc serve "
            "--allow-degraded`); not with --server",
        ),
    ],
)
@pytest.mark.parametrize("in_session", [True, False])
def test_embedded_only_options_are_refused_with_a_server(
    address: str, session: str, tmp_path: Path, option: list[str], message: str, in_session: bool
) -> None:
    where = ["--session", session] if in_session else []
    done = ptc("run", "-", "--server", address, *where, *option, stdin="print(1)", cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr.strip()) == (2, "", message)
    assert not (tmp_path / "x.db").exists()


def test_the_audit_db_environment_variable_is_not_an_option_given(address: str) -> None:
    """$PTC_AUDIT_DB is the embedded default, not a request: with --server it is unused."""
    done = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "run", "-", "--server", address],
        input="print(2)",
        capture_output=True,
        text=True,
        env={**os.environ, "PTC_AUDIT_DB": "/nonexistent/x.db"},
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "2\n"), done.stderr


def test_an_api_key_needs_a_server() -> None:
    refused = ptc("run", "-", "--api-key", "k", stdin="print(1)")
    assert (refused.returncode, refused.stdout, refused.stderr.strip()) == (
        2,
        "",
        "ptc run: --api-key: keys are for a server; give --server ADDR too",
    )
    # $PTC_API_KEY is a default for --server, not an option given: an embedded run ignores it.
    embedded = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "run", "-"],
        input="print(3)",
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PTC_API_KEY": "k", "PTC_AUDIT_DB": ""},
        timeout=120,
        check=False,
    )
    assert (embedded.returncode, embedded.stdout) == (0, "3\n"), embedded.stderr


def test_session_create_takes_backend_gvisor(address: str) -> None:
    """The choice reaches the server (which says what it offers), not an argparse refusal; a
    session on gVisor itself is in tests/server/test_serve_gvisor.py (Docker with runsc)."""
    done = ptc("session", "create", "--server", address, "--backend", "gvisor")
    assert (done.returncode, done.stdout) == (12, "")
    assert done.stderr.strip() == (
        "ptc session: unavailable: backend 'gvisor' is not available on this server (have: process)"
    )
