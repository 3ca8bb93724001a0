"""A session cell's options through the SDK and a real gRPC server (unary `Execute` through
`session.execute`, and `ExecuteStream` through `client.run(session_id=...)`): the script policy
and expected calls apply as on a single-use execution; a backend or runtime other than the
session's is refused with the session's; a limit of the whole sandbox below the session's is
refused, above it is reported as an adjustment. Nothing is ignored."""

from __future__ import annotations

import json

import pytest

from sandbox.errors import InvalidArgument
from sandbox.expectations import ExpectedCalls

from .conftest import SessionServer

MiB = 1024 * 1024
LOOKUP = json.dumps(
    [{"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "integer"}}}}]
)
ESCAPE = "x = 1\nprint(getattr(x, 'real'))"


def test_policy_and_expected_calls_apply_to_a_cell(srv: SessionServer) -> None:
    with srv.a.session(LOOKUP, backend=srv.backend) as session:
        unary = session.execute(ESCAPE, policy="restricted")
        streamed = srv.a.run(ESCAPE, LOOKUP, session_id=session.id, policy="restricted")
        ran = session.execute(ESCAPE)
        # Streamed with no tools given, a cell keeps the session's (`ptc run --session`'s way).
        kept = srv.a.run("import tools\ntools.lookup(q=2)", None, session_id=session.id)
        short = session.execute(
            "import tools\ntools.lookup(q=1)", expected_calls=[ExpectedCalls("lookup", 2, 3)]
        )
    single = srv.a.execute(ESCAPE, backend=srv.backend, policy="restricted")
    for rejected in (unary, streamed):
        assert (rejected.status, rejected.stdout, rejected.calls) == ("rejected", "", [])
        assert rejected.error == single.error
        assert rejected.error is not None and "getattr" in rejected.error.message
    assert (ran.status, ran.stdout) == ("ok", "1\n")
    assert (kept.status, [c.tool for c in kept.calls]) == ("ok", ["lookup"])
    assert short.status == "limit_exceeded"
    assert [(v.limit, v.observed) for v in short.violations] == [("expected_calls", 1)]
    srv.assert_healthy()


def test_another_backend_or_runtime_is_refused_with_the_sessions(srv: SessionServer) -> None:
    other = "docker" if srv.backend == "process" else "process"
    with srv.a.session(backend=srv.backend) as session:
        with pytest.raises(InvalidArgument) as backend:
            session.execute("print(1)", backend=other)
        with pytest.raises(InvalidArgument) as runtime:
            srv.a.run("print(1)", session_id=session.id, runtime="np")
        same = session.execute("x = 3\nx", backend=srv.backend, runtime="default")
    assert str(backend.value) == (
        f"backend: session '{session.id}' runs on '{srv.backend}', not '{other}'"
    )
    assert str(runtime.value) == (
        f"runtime: session '{session.id}' runs in the standard library, not 'np'; a session's "
        "runtime is chosen at CreateSession"
    )
    assert (same.status, same.value) == ("ok", "3")


def test_a_whole_sandbox_limit_on_a_cell(srv: SessionServer) -> None:
    with srv.a.session(backend=srv.backend, limits={"memory_bytes": 256 * MiB}) as session:
        with pytest.raises(InvalidArgument) as lower:  # InvalidLimits on the server
            session.execute("print(1)", limits={"memory_bytes": 128 * MiB})
        higher = session.execute("x = 1\nx", limits={"memory_bytes": 512 * MiB})
        equal = session.execute("x", limits={"memory_bytes": 256 * MiB})
        after = session.execute("x + 1")
    assert str(lower.value) == (
        f"limits.memory: {128 * MiB} bytes is below the {256 * MiB} bytes of session "
        f"'{session.id}', set for its whole sandbox at CreateSession; a cell cannot lower it"
    )
    assert (higher.status, higher.value) == ("ok", "1")
    assert [(a.limit, a.requested, a.applied, a.action) for a in higher.adjustments] == [
        ("memory", 512 * MiB, 256 * MiB, "session")
    ]
    assert higher.effective_limits is not None
    assert higher.effective_limits.memory_bytes == 256 * MiB
    assert (equal.status, equal.adjustments) == ("ok", [])
    assert (after.status, after.value) == ("ok", "2")  # the refusal left the session as it was
