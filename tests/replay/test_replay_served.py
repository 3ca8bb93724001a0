"""Replay through a real `ptc serve` (SQLite audit file, tenants file, loopback port) with the
client SDK: executions recorded with client-side tools (answered by the client over
ExecuteStream) replay with no client tool running; a changed tool reports exactly what differs;
a limit that tripped trips again; unknown ids, other tenants' ids and records that predate
replay are refused with the right error, and the server keeps serving.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.audit import Admission, open_store
from sandbox.client import Client
from sandbox.errors import FailedPrecondition, InvalidArgument, NotFound
from sandbox.result import CallRecord, CallStatus, ExecutionResult, ExecutionStatus
from sandbox.tenants import hash_key
from tests.ptc_serve import ptc_serve

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
KEY_A = "ptc-test-key-replay-acme-0123456789"
KEY_G = "ptc-test-key-replay-globex-0123456789"
TENANTS = f"""
[[tenant]]
id = "acme"
keys = ["{hash_key(KEY_A)}"]

[[tenant]]
id = "globex"
keys = ["{hash_key(KEY_G)}"]
"""
SCRIPT = """\
import tools
for city in ["Paris", "Oslo"]:
    print(city, tools.get_weather(city=city))
"""

ran: list[str] = []  # the client tools' calls, to show that a replay runs none


def get_weather(city: str) -> dict[str, Any]:
    """Current weather for a city."""
    ran.append(city)
    return {"city": city, "temp": len(city) * 3.5}


class Served:
    def __init__(self, address: str, audit_db: Path) -> None:
        self.address = address
        self.audit_db = audit_db
        self.acme = Client(address, KEY_A)
        self.globex = Client(address, KEY_G)

    def close(self) -> None:
        self.acme.close()
        self.globex.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    where = tmp_path_factory.mktemp("replay-serve")
    (where / "tenants.toml").write_text(TENANTS)
    audit_db = where / "audit.db"
    with ptc_serve(
        "--pool-size", "2", "--audit-db", str(audit_db), "--tenants", str(where / "tenants.toml")
    ) as serving:
        harness = Served(serving.address, audit_db)
        try:
            yield harness
        finally:
            harness.close()
    verify = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "audit", "verify", "--db", str(audit_db)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr


def _kinds(report: Any) -> list[tuple[str, str]]:
    return [(d.what, d.kind) for d in report.differences]


def test_client_tools_replay_identically_and_the_replay_is_recorded(served: Served) -> None:
    recorded = served.acme.run(SCRIPT, [get_weather], labels={"case": "identical"})
    assert recorded.status == "ok", recorded.stderr
    assert ran == ["Paris", "Oslo"]
    report = served.acme.replay(recorded.execution_id)
    assert ran == ["Paris", "Oslo"]  # answered from the record: no client tool ran
    assert report.identical, [d.detail for d in report.differences]
    assert report.execution_id == recorded.execution_id
    assert (
        report.result.stdout
        == recorded.stdout
        == ("Paris {'city': 'Paris', 'temp': 17.5}\nOslo {'city': 'Oslo', 'temp': 14.0}\n")
    )
    assert [(c.tool, c.arguments, c.status, c.result) for c in report.result.calls] == [
        (c.tool, c.arguments, c.status, c.result) for c in recorded.calls
    ]
    replay_id = report.result.execution_id
    assert replay_id != recorded.execution_id
    record = served.acme.get_execution(replay_id)
    assert record.replay_of == recorded.execution_id
    assert served.acme.get_execution(recorded.execution_id).replay_of == ""


def test_a_renamed_argument_is_reported_precisely(served: Served) -> None:
    recorded = served.acme.run(SCRIPT, [get_weather])

    def renamed(location: str) -> dict[str, Any]:
        """Current weather for a place."""
        raise AssertionError("a replay runs no tool")

    renamed.__name__ = "get_weather"
    report = served.acme.replay(recorded.execution_id, tools=[renamed])
    message = "get_weather() got an unexpected keyword argument 'city'"
    assert _kinds(report) == [
        ("status", "changed"),
        ("exit_code", "changed"),
        ("error", "changed"),
        ("stdout", "changed"),
        ("stderr", "changed"),
        ("calls[1]", "missing"),
        ("calls[2]", "missing"),
    ]
    by_what = {d.what: d for d in report.differences}
    assert (by_what["status"].recorded, by_what["status"].replayed) == ("ok", "error")
    assert by_what["error"].replayed == {"type": "TypeError", "message": message, "line": 3}
    assert by_what["error"].detail == f"error was none, is TypeError: {message} (line 3)"
    assert by_what["stdout"].replayed == ""
    assert by_what["calls[1]"].recorded == {
        "seq": 1,
        "tool": "get_weather",
        "arguments": {"city": "Paris"},
        "status": "ok",
        "result": {"city": "Paris", "temp": 17.5},
    }
    assert by_what["calls[2]"].detail == (
        "recorded call 2 of 'get_weather' (city='Oslo') was not made by the replay"
    )


def test_a_new_required_argument_is_reported_precisely(served: Served) -> None:
    recorded = served.acme.run(SCRIPT, [get_weather])

    def get_weather_v2(city: str, units: str) -> dict[str, Any]:
        """Current weather for a city, in units."""
        raise AssertionError("a replay runs no tool")

    get_weather_v2.__name__ = "get_weather"
    report = served.acme.replay(recorded.execution_id, tools=[get_weather_v2])
    error = {d.what: d for d in report.differences}["error"]
    assert error.replayed == {
        "type": "TypeError",
        "message": "get_weather() missing 1 required keyword-only argument: 'units'",
        "line": 3,
    }
    assert ("calls[1]", "missing") in _kinds(report)
    assert report.result.status == "error"


def test_a_limit_that_tripped_trips_again(served: Served) -> None:
    script = "import tools\nprint(tools.get_weather(city='Rome'))\nwhile True:\n    pass\n"
    recorded = served.acme.run(script, [get_weather], limits={"wall_time_ms": 1000})
    assert recorded.status == "limit_exceeded"
    assert [(v.limit, v.action) for v in recorded.violations] == [("wall_time", "killed")]
    report = served.acme.replay(recorded.execution_id)
    assert report.identical, [d.detail for d in report.differences]
    assert report.result.status == "limit_exceeded"
    violation = report.result.violations[0]
    assert (violation.limit, violation.limit_value, violation.action, violation.evidence) == (
        "wall_time",
        1.0,
        "killed",
        "host",
    )
    assert report.result.effective_limits is not None
    assert report.result.effective_limits.wall_time_ms == 1000
    # With a larger limit the same script is killed later, with the new value in the report.
    longer = served.acme.replay(recorded.execution_id, limits={"wall_time_ms": 1500})
    assert _kinds(longer) == [("violations", "changed")]
    assert longer.differences[0].replayed[0]["limit_value"] == 1.5


def test_a_call_the_record_cannot_answer_is_refused_and_reported(served: Served) -> None:
    script = (
        "import random, tools\n"
        "try:\n"
        "    print(tools.get_weather(city=f'city-{random.random()}'))\n"
        "except tools.CallRefused as exc:\n"
        "    print('refused:', exc)\n"
    )
    recorded = served.acme.run(script, [get_weather])
    assert recorded.status == "ok"
    report = served.acme.replay(recorded.execution_id)
    assert _kinds(report) == [
        ("stdout", "changed"),
        ("calls[1]", "unmatched"),
        ("calls[1]", "missing"),
    ]
    refusal = (
        "replay: the recording has no call of 'get_weather' with these arguments left to "
        "answer this one; a replay runs no tool"
    )
    assert report.differences[0].replayed == f"refused: {refusal}\n"
    assert report.differences[1].replayed["status"] == "refused"
    assert report.differences[1].replayed["error"] == refusal


def test_unknown_and_other_tenants_ids_are_not_found(served: Served) -> None:
    recorded = served.acme.run("print('acme only')")
    with pytest.raises(NotFound) as unknown:
        served.acme.replay("0" * 32)
    assert unknown.value.message == f"execution_id: no execution {'0' * 32!r}"
    with pytest.raises(NotFound) as other:
        served.globex.replay(recorded.execution_id)
    assert other.value.message == f"execution_id: no execution {recorded.execution_id!r}"
    result = served.globex.execute("print('still ok')")
    assert (result.status, result.stdout) == ("ok", "still ok\n")


def test_a_record_from_before_replay_names_what_is_missing(served: Served) -> None:
    store = open_store(served.audit_db, instance="replay-test")
    try:
        store.admit(
            Admission(
                execution_id="old0" * 8,
                tenant="acme",
                script="print(1)",
                manifest_json="[]",
                manifest_sha256="ab" * 32,
                backend="process",
                policy="none",
                effective_limits=None,  # written as {}: no complete set, as older records
            )
        )
        store.complete(
            "old0" * 8,
            ExecutionResult(
                execution_id="old0" * 8,
                status=ExecutionStatus.OK,
                stdout="1\n",
                calls=[CallRecord(1, "t", {}, CallStatus.OK, result=1)],
            ),
        )
    finally:
        store.close()
    with pytest.raises(FailedPrecondition) as refused:
        served.acme.replay("old0" * 8)
    assert refused.value.message == (
        f"execution {'old0' * 8} cannot be replayed: its record lacks the expected call counts "
        "(expected_calls; it was recorded before replay support); every effective limit in the "
        "proto's units (it was recorded in an older format)"
    )
    result = served.acme.execute("print('still ok')")
    assert (result.status, result.stdout) == ("ok", "still ok\n")


def test_bad_requests_are_invalid_and_the_server_keeps_serving(served: Served) -> None:
    recorded = served.acme.run("print('x')")
    with pytest.raises(InvalidArgument) as empty:
        served.acme.replay("")
    assert empty.value.message == "execution_id: is empty"
    with pytest.raises(InvalidArgument) as manifest:
        served.acme.replay(recorded.execution_id, tools="{not json")
    assert manifest.value.message.startswith("manifest: ")
    with pytest.raises(InvalidArgument) as limits:
        served.acme.replay(recorded.execution_id, limits={"wall_time_ms": 0})
    assert limits.value.message == "limits.wall_time_ms: must be a positive integer (ms), got 0"
    with pytest.raises(InvalidArgument) as backend:
        served.acme.replay(recorded.execution_id, backend="vm")
    assert backend.value.message == "backend: unknown backend 'vm' (known: process, docker, gvisor)"
    result = served.acme.execute("print('still ok')")
    assert (result.status, result.stdout) == ("ok", "still ok\n")


def test_ptc_replay_against_the_server(served: Served) -> None:
    recorded = served.acme.run(SCRIPT, [get_weather])
    env = {**os.environ, "PTC_API_KEY": KEY_A}
    args = [PYTHON, "-m", "sandbox.cli", "replay", recorded.execution_id, "--server"]
    done = subprocess.run(
        [*args, served.address, "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["identical"], report["execution_id"]) == (True, recorded.execution_id)
    env["PTC_API_KEY"] = KEY_G
    other = subprocess.run(
        [*args, served.address],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert (other.returncode, other.stderr) == (
        8,
        f"ptc replay: not found: server {served.address}: execution_id: no execution "
        f"{recorded.execution_id!r}\n",
    )
