"""Runtimes through a real `ptc serve` with a tenants file: the client SDK and `ptc run --server
--runtime`; a tenant not allowed a runtime gets PERMISSION_DENIED, an unknown one NOT_FOUND, a
bad name INVALID_ARGUMENT, and the server keeps serving."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.client import Client
from sandbox.errors import InvalidArgument, NotFound, PermissionDenied
from sandbox.tenants import hash_key
from tests.ptc_serve import ptc_serve
from tests.runtimes.runtime_support import PYTHON, ROOT, ptc

ACME = "ptc-test-key-runtimes-acme-0123456789"
BETA = "ptc-test-key-runtimes-beta-0123456789"
TENANTS = f"""
[[tenant]]
id = "acme"
keys = ["{hash_key(ACME)}"]
runtimes = ["np", "gone"]  # "gone" was never built

[[tenant]]
id = "beta"
keys = ["{hash_key(BETA)}"]
"""
SCRIPT = "import numpy as np\nprint(int(np.dot([1, 2, 3], [4, 5, 6])))\n"


@pytest.fixture(scope="module")
def address(
    tmp_path_factory: pytest.TempPathFactory, runtimes_env: dict[str, str]
) -> Iterator[str]:
    tenants = tmp_path_factory.mktemp("tenants") / "tenants.toml"
    tenants.write_text(TENANTS)
    with ptc_serve(
        "--pool-size", "1", "--audit-db", "memory", "--tenants", str(tenants), env=runtimes_env
    ) as serving:
        yield serving.address


def _assert_healthy(address: str) -> None:
    with Client(address, ACME) as client:
        result = client.execute("print('still ok')")
    assert (result.status, result.stdout) == ("ok", "still ok\n")


def test_sdk_runs_numpy_in_an_allowed_runtime(address: str) -> None:
    with Client(address, ACME) as client:
        unary = client.execute(SCRIPT, runtime="np")
        streamed = client.run(SCRIPT, runtime="np")
    for result in (unary, streamed):
        assert (result.status, result.stdout) == ("ok", "32\n")
        assert "runtime:np" in result.isolation


def test_tenant_not_allowed_a_runtime_is_denied(address: str) -> None:
    with Client(address, BETA) as client:
        with pytest.raises(PermissionDenied) as caught:
            client.execute(SCRIPT, runtime="np")
        assert caught.value.message == (
            "runtime: tenant 'beta' may not use 'np' (allowed: only the default)"
        )
        with pytest.raises(PermissionDenied):
            client.run(SCRIPT, runtime="np")
        plain = client.execute("print(2)")  # the standard library stays allowed
        assert (plain.status, plain.stdout) == ("ok", "2\n")
    with Client(address, ACME) as client, pytest.raises(PermissionDenied) as other:
        client.execute("print(1)", runtime="pure")
    assert other.value.message == "runtime: tenant 'acme' may not use 'pure' (allowed: gone, np)"
    _assert_healthy(address)


def test_bad_runtime_names_through_the_server(address: str) -> None:
    with Client(address, ACME) as client:
        # Not built: NOT_FOUND, naming only the tenant's own runtimes (not "pure", nor where
        # the runtimes are).
        with pytest.raises(NotFound) as missing:
            client.execute("print(1)", runtime="gone")
        assert missing.value.message == (
            "runtime: no runtime named 'gone' on this server (tenant 'acme' may use: gone, np)"
        )
        # A bad name is refused as such, before the tenant's list is consulted.
        with pytest.raises(InvalidArgument) as escape:
            client.execute("print(1)", runtime="../np")
        assert escape.value.message == (
            "runtime: '../np' is not a valid runtime name (1-64 of [a-z0-9._-], starting with a "
            "letter or digit, no '..')"
        )
    _assert_healthy(address)


def test_cli_run_with_runtime_through_the_server(
    address: str, runtimes_env: dict[str, str]
) -> None:
    env = {**runtimes_env, "PTC_API_KEY": ACME}
    done = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "run", "-", "--server", address, "--runtime", "np", "--json"],
        input=SCRIPT, capture_output=True, text=True, cwd=ROOT, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stdout"] == "32\n"
    denied = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "run", "-", "--server", address, "--runtime", "np"],
        input=SCRIPT, capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
        env={**runtimes_env, "PTC_API_KEY": BETA},
    )  # fmt: skip
    assert denied.returncode == 10
    assert denied.stderr.startswith(f"ptc run: permission denied: server {address}: runtime: ")


def test_cli_run_embedded_with_runtime(runtimes_env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    done = ptc("run", str(script), "--runtime", "np", "--json", env=runtimes_env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["status"], result["stdout"]) == ("ok", "32\n")
    assert result["isolation"][-1] == "runtime:np"
    missing = ptc("run", str(script), "--runtime", "nope", "--json", env=runtimes_env)
    assert missing.returncode == NotFound.exit_code
    assert missing.stderr.startswith("ptc run: not found: runtime: no runtime named 'nope' in ")
    bad = ptc("run", str(script), "--runtime", "a/b", "--json", env=runtimes_env)
    assert bad.returncode == InvalidArgument.exit_code
    assert bad.stderr == (
        "ptc run: runtime: 'a/b' is not a valid runtime name (1-64 of [a-z0-9._-], starting "
        "with a letter or digit, no '..')\n"
    )


def test_a_session_in_a_runtime_keeps_numpy_state_across_cells(address: str) -> None:
    with Client(address, ACME) as client:
        with client.session(runtime="np") as session:
            first = session.execute("import numpy as np\na = np.arange(4)")
            second = session.execute("a = a * 10\nint(a.sum())")
            with pytest.raises(InvalidArgument) as moved:
                client.run("print(1)", runtime="pure", session_id=session.id)
            info = client.list_sessions()
            record = client.get_execution(second.execution_id)
        assert (first.status, second.status, second.value) == ("ok", "ok", "60")
        assert "runtime:np" in second.isolation
        assert [(s.session_id, s.runtime) for s in info] == [(session.id, "np")]
        assert record.runtime == "np"  # each cell's record names the runtime it ran in
        assert moved.value.message == (
            f"runtime: session {session.id!r} runs in runtime 'np', not 'pure'; a session's "
            "runtime is chosen at CreateSession"
        )
        with client.session() as plain:
            with pytest.raises(InvalidArgument) as caught:
                client.run("print(1)", runtime="np", session_id=plain.id)
            cell = plain.execute("print(2)")
        assert caught.value.message == (
            f"runtime: session {plain.id!r} runs in the standard library, not 'np'; a "
            "session's runtime is chosen at CreateSession"
        )
        assert (cell.status, cell.stdout) == ("ok", "2\n")
    with Client(address, BETA) as client, pytest.raises(PermissionDenied) as denied:
        client.session(runtime="np").create()
    assert (
        denied.value.message
        == "runtime: tenant 'beta' may not use 'np' (allowed: only the default)"
    )
    _assert_healthy(address)


def test_the_runtime_is_recorded_and_replayed_through_the_server(address: str) -> None:
    with Client(address, ACME) as client:
        ran = client.execute(SCRIPT, runtime="np")
        record = client.get_execution(ran.execution_id)
        plain = client.get_execution(client.execute("print(1)").execution_id)
        report = client.replay(ran.execution_id)
        replayed = client.get_execution(report.result.execution_id)
    assert (record.runtime, plain.runtime) == ("np", "")
    # Without the runtime the replay would fail at `import numpy`: it ran in the same one.
    assert report.identical, report.differences
    assert (report.result.status, report.result.stdout) == ("ok", "32\n")
    assert "runtime:np" in report.result.isolation
    assert (replayed.runtime, replayed.replay_of) == ("np", ran.execution_id)


def test_cli_replay_embedded_runs_in_the_recorded_runtime(
    runtimes_env: dict[str, str], tmp_path: Path
) -> None:
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    db = str(tmp_path / "audit.db")
    done = ptc("run", str(script), "--runtime", "np", "--json", "--audit-db", db, env=runtimes_env)
    assert done.returncode == 0, done.stderr
    execution_id = json.loads(done.stdout)["execution_id"]
    replayed = ptc("replay", execution_id, "--audit-db", db, "--json", env=runtimes_env)
    assert replayed.returncode == 0, replayed.stderr
    report = json.loads(replayed.stdout)
    assert (report["identical"], report["result"]["stdout"]) == (True, "32\n")
    assert report["result"]["isolation"][-1] == "runtime:np"


def test_cli_session_in_a_runtime(address: str, runtimes_env: dict[str, str]) -> None:
    env = {**runtimes_env, "PTC_API_KEY": ACME}
    created = ptc("session", "create", "--server", address, "--runtime", "np", "--json", env=env)
    assert created.returncode == 0, created.stderr
    info = json.loads(created.stdout)
    assert info["runtime"] == "np"
    session_id = info["session_id"]
    try:
        ran = subprocess.run(
            [PYTHON, "-m", "sandbox.cli", "run", "-", "--server", address, "--session",
             session_id, "--json"],
            input=SCRIPT, capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
            env=env,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        assert json.loads(ran.stdout)["stdout"] == "32\n"
    finally:
        closed = ptc("session", "close", session_id, "--server", address, env=env)
    assert closed.returncode == 0, closed.stderr
