"""`ptc run --server` against a real `ptc serve` with a tenants file: each service error comes
back as its own `sandbox.errors` class, with the server's message and its own exit code (the
table in sandbox/errors.py), and human mode prints the script's output as it arrives.

Also: `import sandbox.client` loads nothing of the server side (checked in a fresh interpreter).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.client import Client, ExecutionQuery
from sandbox.errors import PermissionDenied, ResourceExhausted, Unauthenticated
from sandbox.tenants import hash_key
from tests.ptc_cli import run_ptc
from tests.ptc_serve import ptc_serve

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
KEY = "ptc-test-key-cli-server-0123456789"
TENANTS = f"""
[[tenant]]
id = "acme"
keys = ["{hash_key(KEY)}"]
max_concurrent = 1
queue = 0
backends = ["process"]

[tenant.ceilings]
input_files = 2
output_files = 1
"""


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tenants = tmp_path_factory.mktemp("tenants") / "tenants.toml"
    tenants.write_text(TENANTS)
    with ptc_serve("--pool-size", "2", "--audit-db", "memory", "--tenants", str(tenants)) as s:
        yield s.address


def _ptc_run(
    address: str, *args: str, script: str = "print(1)", key: str | None = KEY
) -> subprocess.CompletedProcess[str]:
    return run_ptc(
        "run", "-", "--server", address, *args,
        stdin=script,
        env={"PTC_API_KEY": key} if key is not None else None,
        without=("PTC_API_KEY",),
    )  # fmt: skip


def test_ok_through_the_server_with_a_key(address: str) -> None:
    done = _ptc_run(address, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stdout"] == "1\n"


def test_no_key_is_unauthenticated(address: str) -> None:
    done = _ptc_run(address, key=None)
    assert done.returncode == 9, done.stderr
    assert done.stderr.startswith(f"ptc run: unauthenticated: server {address}: "), done.stderr
    assert done.stdout == ""


def test_backend_the_tenant_may_not_use_is_permission_denied(address: str) -> None:
    done = _ptc_run(address, "--backend", "docker")
    assert done.returncode == 10, done.stderr
    assert done.stderr.startswith(f"ptc run: permission denied: server {address}: "), done.stderr
    assert "docker" in done.stderr


def test_bad_manifest_is_an_invalid_argument(address: str, tmp_path: Path) -> None:
    manifest = tmp_path / "tools.json"
    manifest.write_text('{"tools": 3}')
    done = _ptc_run(address, "--tools", str(manifest))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"ptc run: server {address}: manifest"), done.stderr


def test_full_queue_is_resource_exhausted(address: str) -> None:
    with Client(address, KEY) as client:
        running = client.stream("import time\nprint('busy', flush=True)\ntime.sleep(30)")
        next(iter(running))  # admitted and running: the tenant's one slot is taken
        try:
            done = _ptc_run(address)
            with pytest.raises(ResourceExhausted) as info:
                client.execute("print(2)")
        finally:
            running.cancel("test done")
            assert running.result(timeout=30).status == "cancelled"
    assert done.returncode == 11, done.stderr
    assert done.stderr.startswith(f"ptc run: resource exhausted: server {address}: tenant acme")
    assert info.value.retry_after_s is not None and info.value.retry_after_s > 0


def test_client_raises_the_error_classes(address: str) -> None:
    with Client(address) as anonymous, pytest.raises(Unauthenticated):
        anonymous.execute("print(1)")
    with Client(address, KEY) as client, pytest.raises(PermissionDenied) as info:
        client.execute("print(1)", backend="docker")
    assert "docker" in info.value.message


def test_human_mode_streams_output_through_the_server(address: str) -> None:
    _assert_streams([PYTHON, "-m", "sandbox.cli", "run", "-", "--server", address], KEY)


def _assert_streams(argv: list[str], key: str | None = None) -> None:
    """The first line reaches our pipe while the script still sleeps, long before the end."""
    env = {**os.environ, **({"PTC_API_KEY": key} if key else {})}
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(b"import time\nprint('first', flush=True)\ntime.sleep(3)\nprint('second')\n")
    proc.stdin.close()
    first = proc.stdout.readline()
    first_at = time.monotonic() - started
    still_running = proc.poll() is None
    rest = proc.stdout.read()
    end_at = time.monotonic() - started
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=30) == 0, stderr
    proc.stdout.close()
    proc.stderr.close()
    assert first == b"first\n"
    assert still_running
    assert end_at - first_at >= 2.0, (first_at, end_at)
    assert rest == b"second\n"
    assert "── status: ok" in stderr


def test_import_client_changes_nothing_in_the_callers_environment() -> None:
    code = (
        "import json, os; before = dict(os.environ); import sandbox.client; "
        "print(json.dumps({k: v for k, v in os.environ.items() if before.get(k) != v}))"
    )
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    done = subprocess.run(
        [PYTHON, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        check=True,
    )
    assert json.loads(done.stdout) == {}


def test_import_client_loads_no_server_side_module() -> None:
    code = "import json, sys, sandbox.client; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [PYTHON, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60, check=True
    )
    loaded = json.loads(done.stdout)
    assert "sandbox.client" in loaded and "sandbox.codec.result" in loaded
    server_side = (
        "sandbox.server",
        "sandbox.engine",
        "sandbox.backends",
        "sandbox.audit",
        "sandbox.execution",
        "sandbox.recording",
        "sandbox.tenants",
        "docker",
    )
    assert [m for m in loaded if m.startswith(server_side)] == []


def test_files_through_the_server_under_the_tenants_ceilings(address: str, tmp_path: Path) -> None:
    data = tmp_path / "data.bin"
    data.write_bytes(bytes(range(256)))
    script = "import shutil\nshutil.copy('in.bin', 'outputs/a')\nshutil.copy('in.bin', 'outputs/b')"
    out = tmp_path / "out"
    done = _ptc_run(
        address, "--json", "--file", f"{data}=in.bin", "--outputs-dir", str(out), script=script
    )
    assert done.returncode == 3, done.stderr  # limit_exceeded: the tenant returns one file
    result = json.loads(done.stdout)
    assert result["limits"]["input_files"] == 2 and result["limits"]["output_files"] == 1
    assert [f["name"] for f in result["output_files"]] == ["a"]
    assert "content_base64" not in result["output_files"][0]  # saved instead
    assert (out / "a").read_bytes() == bytes(range(256)) and not (out / "b").exists()
    assert [(o["name"], o["reason"], o["limit"]) for o in result["omitted_outputs"]] == [
        ("b", "output_files", 1)
    ]
    three = [arg for i in range(3) for arg in ("--file", f"{data}=f{i}")]
    refused = _ptc_run(address, *three)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr == (
        f"ptc run: server {address}: input_files: 3 files is more than the input_files limit of 2\n"
    )


def test_ctrl_c_cancels_the_execution_on_the_server(address: str, tmp_path: Path) -> None:
    """Ctrl-C on `ptc run --server` closes the stream, which cancels the execution there; the
    command says so and exits 130, and the server's record says cancelled, with the output."""
    script = "import time\nprint('ctrl-c test', flush=True)\ntime.sleep(600)\n"
    path = tmp_path / "long.py"
    path.write_text(script)
    args = ["run", str(path), "--server", address, "--limit", "wall_time=600"]
    with subprocess.Popen(
        [PYTHON, "-m", "sandbox.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PTC_API_KEY": KEY},
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "ctrl-c test\n"  # it runs, shown live
            proc.send_signal(signal.SIGINT)
            _out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:  # it ignored the Ctrl-C: fail, and leave no process behind
                proc.kill()
                proc.communicate()
    assert proc.returncode == 130, err
    assert f"ptc run: Ctrl-C: the execution is cancelled on {address}" in err
    with Client(address, KEY) as client:
        for _ in range(600):  # the server hears of it a moment later (bounded)
            records = client.list_executions(ExecutionQuery(status="cancelled")).records
            mine = [r for r in records if r.script == script]
            if mine:
                break
            time.sleep(0.05)
    assert [r.result.stdout if r.result else None for r in mine] == ["ctrl-c test\n"]
