"""The gVisor tier through a real `ptc serve --gvisor` with a tenants file: a tenant allowed
backend `gvisor` runs there (the result's `isolation` names runsc, and the script sees gVisor's
kernel, not the host's); a tenant limited to `process` gets PERMISSION_DENIED at admission, with
the exact message, and the server keeps serving; at exit the server leaves no container."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import NamedTuple

import pytest

from sandbox.backends.docker import engine_client
from sandbox.backends.docker.spec import LABEL_OWNER
from sandbox.client import Client
from sandbox.errors import PermissionDenied
from sandbox.tenants import hash_key
from tests.ptc_cli import CLIENT_ENV, run_ptc
from tests.ptc_serve import ptc_serve

pytestmark = [pytest.mark.requires_docker, pytest.mark.requires_gvisor]

ACME = "ptc-test-key-gvisor-acme-0123456789"
BETA = "ptc-test-key-gvisor-beta-0123456789"
TENANTS = f"""
[[tenant]]
id = "acme"
keys = ["{hash_key(ACME)}"]
backends = ["process", "gvisor"]

[[tenant]]
id = "beta"
keys = ["{hash_key(BETA)}"]
backends = ["process"]
"""
# gVisor's kernel reports its own release, whatever the host runs.
SCRIPT = "import os\nprint(os.uname().release)\n"
DENIED = "backend: tenant 'beta' may not use 'gvisor' (allowed: process)"


def _containers_of(pid: int) -> list[str]:
    client = engine_client.connect(engine_client.engine_address())
    try:
        return [
            str(c.name)
            for c in client.containers.list(
                all=True, filters={"label": LABEL_OWNER}, ignore_removed=True
            )
            if c.labels[LABEL_OWNER].split(":")[1] == str(pid)
        ]
    finally:
        client.close()


class Served(NamedTuple):
    address: str
    pid: int


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tenants = tmp_path_factory.mktemp("tenants") / "tenants.toml"
    tenants.write_text(TENANTS)
    with ptc_serve(
        "--pool-size", "1", "--audit-db", "memory", "--tenants", str(tenants), "--gvisor"
    ) as serving:
        yield Served(serving.address, serving.pid)
    assert _containers_of(serving.pid) == []


def test_a_tenant_allowed_gvisor_runs_under_runsc(served: Served) -> None:
    with Client(served.address, ACME) as client:
        unary = client.execute(SCRIPT, backend="gvisor")
        streamed = client.run(SCRIPT, backend="gvisor")
        process = client.execute(SCRIPT, backend="process")
    assert (process.status, process.stdout) == ("ok", f"{os.uname().release}\n")
    for result in (unary, streamed):
        assert (result.status, result.exit_code, result.stderr) == ("ok", 0, ""), result.to_json()
        assert result.backend == "gvisor"
        assert {"oci-runtime:runsc", "gvisor"} <= set(result.isolation), result.isolation
        assert "oci-runtime:runc" not in result.isolation
        assert result.stdout != process.stdout  # gVisor's kernel answered uname, not the host's
    assert _containers_of(served.pid)  # its warm pool: what the fixture checks is gone at exit


def test_a_tenant_limited_to_process_is_denied_gvisor(served: Served) -> None:
    with Client(served.address, BETA) as client:
        with pytest.raises(PermissionDenied) as unary:
            client.execute(SCRIPT, backend="gvisor")
        with pytest.raises(PermissionDenied) as streamed:
            client.run(SCRIPT, backend="gvisor")
        assert unary.value.message == streamed.value.message == DENIED
        plain = client.execute("print(2)")  # its own backend still serves it
        assert (plain.status, plain.stdout, plain.backend) == ("ok", "2\n", "process")
    with Client(served.address, ACME) as client:
        again = client.execute("print('still ok')", backend="gvisor")
    assert (again.status, again.stdout) == ("ok", "still ok\n")


def test_without_a_tenants_file_the_single_tenant_may_use_gvisor() -> None:
    """`ptc serve --gvisor` alone: its one tenant runs on the backend it offers, by `ptc run
    --backend gvisor` and in a session made by `ptc session create --backend gvisor`."""
    with ptc_serve("--pool-size", "1", "--audit-db", "memory", "--gvisor") as serving:
        ran = _ptc("run", "-", "--json", "--server", serving.address, "--backend", "gvisor")
        assert ran.returncode == 0, ran.stderr
        created = _ptc(
            "session", "create", "--server", serving.address, "--backend", "gvisor", stdin=""
        )
        assert created.returncode == 0, created.stderr
        sid = created.stdout.strip()
        cell = _ptc("run", "-", "--json", "--server", serving.address, "--session", sid)
        closed = _ptc("session", "close", sid, "--server", serving.address, stdin="")
        assert closed.returncode == 0, closed.stderr
    for done in (ran, cell):
        result = json.loads(done.stdout)
        assert (result["status"], result["backend"]) == ("ok", "gvisor"), result
        assert result["stdout"] != f"{os.uname().release}\n"  # gVisor's kernel answered
    assert _containers_of(serving.pid) == []


def _ptc(*args: str, stdin: str = SCRIPT) -> subprocess.CompletedProcess[str]:
    return run_ptc(*args, stdin=stdin, without=CLIENT_ENV)
