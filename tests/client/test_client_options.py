"""The SDK's surface without a server: one `RunOptions` value (and its keyword form) carried to
the request unchanged, and no public method that speaks in `sandbox._proto` types."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from pathlib import Path
from typing import Any

import pytest

from sandbox._proto import sandbox_pb2 as pb
from sandbox.client import (
    AsyncClient,
    AsyncSession,
    Client,
    Execution,
    ExecutionQuery,
    RunOptions,
    SessionOptions,
    SyncExecution,
    SyncSession,
)
from sandbox.client.aio import _execute_request as execute_request
from sandbox.codec.query import query_to_proto
from sandbox.errors import InvalidArgument
from sandbox.expectations import ExpectedCalls
from sandbox.files import InputFile
from sandbox.integrations import ExecuteTool, RunRequest
from sandbox.integrations.runners import execution_request
from sandbox.limits import Limits
from sandbox.options import RunOverrides, SessionOverrides
from sandbox.result import ExecutionResult

SDK_CLASSES = (AsyncClient, Client, AsyncSession, SyncSession, Execution, SyncExecution)


def _public_methods() -> list[tuple[str, Any]]:
    return [
        (f"{cls.__name__}.{name}", member)
        for cls in SDK_CLASSES
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    ]


def _proto_types(annotation: Any) -> list[str]:
    """Every class named anywhere in ``annotation`` that lives in `sandbox._proto`."""
    found = []
    if isinstance(annotation, type) and annotation.__module__.startswith("sandbox._proto"):
        found.append(annotation.__qualname__)
    for arg in typing.get_args(annotation):
        found += _proto_types(arg)
    return found


@pytest.mark.parametrize("name,method", _public_methods(), ids=[n for n, _ in _public_methods()])
def test_no_public_sdk_method_speaks_in_proto_types(name: str, method: Any) -> None:
    signature = inspect.signature(method)
    texts = [str(p.annotation) for p in signature.parameters.values()]
    texts.append(str(signature.return_annotation))
    assert not [t for t in texts if "pb." in t or "_pb2" in t], name
    # The return annotation, resolved in the method's module, names no proto class either.
    module = inspect.getmodule(method)
    returned = eval(signature.return_annotation, vars(module))  # our own source
    assert _proto_types(returned) == [], name


def test_the_methods_that_used_to_return_proto_messages_are_covered() -> None:
    names = {name for name, _ in _public_methods()}
    for expected in (
        "Client.get_execution",
        "Client.list_executions",
        "Client.list_sessions",
        "AsyncClient.get_execution",
        "AsyncClient.list_executions",
        "AsyncClient.list_sessions",
        "SyncSession.create",
        "SyncSession.get",
        "SyncSession.close",
        "AsyncSession.create",
        "AsyncSession.get",
        "AsyncSession.close",
    ):
        assert expected in names


def test_keyword_overrides_name_exactly_the_options_fields() -> None:
    assert set(RunOverrides.__annotations__) == {f.name for f in dataclasses.fields(RunOptions)}
    assert set(SessionOverrides.__annotations__) == {
        f.name for f in dataclasses.fields(SessionOptions)
    }


def test_options_from_what_a_caller_has_at_hand(tmp_path: Path) -> None:
    data = tmp_path / "data.csv"
    data.write_bytes(b"a,b\n")
    labels = {"team": "qa"}
    options = RunOptions.of(
        limits={"wall_time": 2, "memory_bytes": 1 << 28},  # a name in seconds, a field in bytes
        files=[data],
        expected_calls=[ExpectedCalls("search", 1)],
        labels=labels,
    )
    labels["team"] = "changed later"
    assert options.limits == Limits(wall_time_ms=2000, memory_bytes=1 << 28)
    assert options.files == (InputFile("data.csv", b"a,b\n"),)
    assert options.expected_calls == (ExpectedCalls("search", 1),)
    assert dict(options.labels) == {"team": "qa"}
    with pytest.raises(TypeError):
        options.labels["team"] = "x"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.backend = "docker"  # type: ignore[misc]
    # An override replaces that field only.
    again = RunOptions.of(options, backend="docker", timeout=3.0)
    assert (again.backend, again.timeout, again.limits) == ("docker", 3.0, options.limits)


def test_options_built_directly_are_frozen_all_the_way_down() -> None:
    calls, files = [ExpectedCalls("search", 1)], [InputFile("a.txt", b"a")]
    labels: dict[str, str] = {}
    options = RunOptions(expected_calls=calls, files=files, labels=labels)  # type: ignore[arg-type]
    calls.append(ExpectedCalls("other"))
    files.clear()
    labels["team"] = "added later"
    assert options.expected_calls == (ExpectedCalls("search", 1),)
    assert options.files == (InputFile("a.txt", b"a"),)
    assert dict(options.labels) == {}
    with pytest.raises(TypeError):
        options.labels["team"] = "x"  # type: ignore[index]


@pytest.mark.parametrize(
    "build,error,message",
    [
        (
            lambda: RunOptions(backend="vm"),
            InvalidArgument,
            "backend: unknown backend 'vm' (known: process, docker, gvisor)",
        ),
        (
            lambda: RunOptions(policy="strict"),  # type: ignore[arg-type]
            InvalidArgument,
            "policy: unknown policy 'strict' (known: none, restricted)",
        ),
        (
            lambda: SessionOptions(backend="vm"),
            InvalidArgument,
            "backend: unknown backend 'vm' (known: process, docker, gvisor)",
        ),
        (
            lambda: RunOptions.of(limit={"wall_time": 1}),  # type: ignore[call-arg]
            TypeError,
            "unexpected keyword argument 'limit' (options: limits, backend, runtime, policy, "
            "expected_calls, files, labels, timeout, session_id, idempotency_key)",
        ),
        (
            lambda: RunOptions.of(limits={"wall": 1}),
            InvalidArgument,
            None,
        ),
    ],
    ids=["backend", "policy", "session-backend", "unknown-keyword", "unknown-limit"],
)
def test_bad_options_are_refused_naming_what(build: Any, error: type, message: str | None) -> None:
    with pytest.raises(error) as info:
        build()
    if message is not None:
        assert str(info.value) == message
    else:
        assert "wall" in str(info.value)


def test_the_request_carries_every_option() -> None:
    options = RunOptions.of(
        limits={"wall_time_ms": 2000},
        backend="gvisor",
        runtime="np",
        policy="restricted",
        expected_calls=[ExpectedCalls("echo_it", 1, 3)],
        files={"in.txt": b"hi"},
        labels={"team": "qa"},
        timeout=5.0,
        session_id="s-" + "0" * 32,
    )
    request, local = execute_request("print(1)", [], options)
    assert local == {}
    assert request.limits.wall_time_ms == 2000 and not request.limits.HasField("memory_bytes")
    assert (request.backend, request.runtime, request.policy) == (
        pb.BACKEND_GVISOR,
        "np",
        pb.SCRIPT_POLICY_RESTRICTED,
    )
    assert [(e.tool, e.min, e.max) for e in request.expected_calls] == [("echo_it", 1, 3)]
    assert [(f.name, f.content) for f in request.input_files] == [("in.txt", b"hi")]
    assert (dict(request.labels), request.session_id) == ({"team": "qa"}, options.session_id)
    assert request.manifest.json == "[]"
    # A cell given no tools keeps its session's: the request carries no manifest.
    kept, _ = execute_request("print(1)", None, options)
    assert not kept.HasField("manifest")


def test_the_execute_tool_takes_the_same_options_either_way() -> None:
    class Runner:  # never runs: only the request is looked at
        def run(self, request: RunRequest) -> ExecutionResult:
            raise AssertionError

        async def arun(self, request: RunRequest) -> ExecutionResult:
            raise AssertionError

        def close(self) -> None: ...

    options = RunOptions.of(limits={"wall_time_ms": 2000}, policy="restricted", files={"a": b"1"})
    by_keywords = ExecuteTool(
        Runner(), limits=options.limits, policy="restricted", files=options.files
    )
    by_value = ExecuteTool(Runner(), options=options)
    assert by_keywords.options == by_value.options == options
    request = by_value.request("print(1)", [ExpectedCalls("x", 1)], files={"b": b"2"})
    assert request.options.expected_calls == (ExpectedCalls("x", 1),)
    assert [f.name for f in request.options.files] == ["a", "b"]
    assert request.options.limits == options.limits


def test_an_embedded_run_refuses_what_it_cannot_honour() -> None:
    with pytest.raises(InvalidArgument) as deadline:
        execution_request("print(1)", "[]", RunOptions(timeout=1.0))
    assert str(deadline.value) == (
        "timeout: the client SDK's call deadline; not for an embedded run"
    )
    request = execution_request("print(1)", "[]", RunOptions(policy="restricted"))
    assert (request.policy, request.backend, request.limits) == ("restricted", None, Limits())


def test_an_execution_query_becomes_the_list_request() -> None:
    message = query_to_proto(
        ExecutionQuery(since=10.5, status="limit_exceeded", tool="t", page_size=5)
    )
    assert (message.since.seconds, message.since.nanos) == (10, 500_000_000)
    assert message.status == pb.EXECUTION_STATUS_LIMIT_EXCEEDED
    assert (message.tool, message.page_size, message.HasField("until")) == ("t", 5, False)
    with pytest.raises(InvalidArgument) as bad:
        query_to_proto(ExecutionQuery(status="done"))
    assert str(bad.value) == (
        "status: unknown status 'done' (known: ok, error, limit_exceeded, rejected, cancelled,"
        " interrupted, failed, running)"
    )
    running = query_to_proto(ExecutionQuery(status="running"))  # a record's, not a result's
    assert (running.running, running.status) == (True, pb.EXECUTION_STATUS_UNSPECIFIED)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"wall_time": 2}, Limits(wall_time_ms=2000)),
        ({"wall_time": 0.25, "cpu_time": 1.5}, Limits(wall_time_ms=250, cpu_time_ms=1500)),
        ({"wall_time_ms": 90}, Limits(wall_time_ms=90)),
        (
            {"memory": "256m", "file_size": "2m"},
            Limits(memory_bytes=1 << 28, file_size_bytes=1 << 21),
        ),
        ({"memory_bytes": 1 << 28, "processes": 8}, Limits(memory_bytes=1 << 28, processes=8)),
    ],
    ids=["seconds", "fractions", "canonical-field", "size-suffixes", "canonical-sizes"],
)
def test_a_limit_name_takes_the_cli_units_and_a_field_its_canonical_integer(
    given: dict[str, Any], expected: Limits
) -> None:
    """`{"wall_time": 90}` is 90 s, as `ptc run --limit wall_time=90` and a tenants file say
    (it was 90 ms in the SDK alone); the unit-named field takes milliseconds."""
    assert RunOptions.of(limits=given).limits == expected


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"wall_time": "soon"}, "limits.wall_time: 'soon' is not a number (s)"),
        ({"wall_time_ms": 1.5}, "limits.wall_time_ms: must be a positive integer (ms), got 1.5"),
        ({"wall_time": None}, "limits.wall_time: must be a number (s), got None"),
        (
            {"memory": "1k"},
            "limits.memory: 1024 bytes is below the minimum of 33554432 bytes",
        ),
        (
            {"wall_time": 2, "wall_time_ms": 2000},
            "limits: wall_time and wall_time_ms are the same limit; give one",
        ),
    ],
    ids=["not-a-number", "fraction-of-ms", "none", "below-minimum", "both-spellings"],
)
def test_a_bad_limit_mapping_is_refused_naming_the_key(given: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        RunOptions.of(limits=given)
    assert str(info.value) == message
