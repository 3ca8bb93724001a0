"""A violation's evidence and its absent `observed` cross the wire and the audit store intact:
through a real server and client, and back from the audit record the server kept."""

from __future__ import annotations

from sandbox.expectations import ExpectedCalls
from tests.server.server_support import manifest

MiB = 1 << 20
ECHO = manifest(("echo", "echo", {"i": {"type": "integer"}}))


def test_evidence_round_trips_through_the_server_and_its_audit_record(server):
    script = (
        "import sys, tools\ntools.echo(i=1)\nsys.stdout.write('a' * 2000)\n"
        "with open('/tmp/f', 'wb') as f:\n    f.write(b'f' * (2 << 20))\n"
    )
    result = server.client.execute(
        script,
        ECHO,
        limits={"file_size": MiB, "stdout_bytes": 1000},
        expected_calls=[ExpectedCalls("echo", min=2)],
    )
    assert result.status == "limit_exceeded"
    assert [(v.limit, v.observed, v.action, v.evidence) for v in result.violations] == [
        ("file_size", MiB, "refused", "host"),
        ("stdout_bytes", 2000, "truncated", "host"),
        ("expected_calls", 1, "reported", "host"),
    ]
    record = server.client.get_execution(result.execution_id)
    assert record.result is not None
    assert [(v.limit, v.observed, v.action, v.evidence) for v in record.result.violations] == [
        ("file_size", MiB, "refused", "host"),
        ("stdout_bytes", 2000, "truncated", "host"),
        ("expected_calls", 1, "reported", "host"),
    ]


def test_guest_evidence_and_nothing_measured_round_trip(server):
    result = server.client.execute(
        "files = [open('/dev/null') for _ in range(64)]", limits={"open_files": 32}
    )
    assert [(v.limit, v.observed, v.evidence) for v in result.violations] == [
        ("open_files", None, "guest")
    ]
    record = server.client.get_execution(result.execution_id)
    assert record.result is not None
    [violation] = record.result.violations
    assert (violation.observed, violation.evidence) == (None, "guest")


def test_a_raised_memory_error_is_an_error_over_the_wire(server):
    result = server.client.execute("raise MemoryError")
    assert (result.status, result.violations) == ("error", [])
    server.assert_healthy()
