"""`ExecuteRequest` <-> a `Request`: a script, its manifest and its `RunOptions`, the three things
a caller gives for one execution, which the client encodes and the server decodes back.

The client refuses before sending what no server accepts (the script and manifest caps, input
files over the ceilings); the server checks every field on the way in, and a bad one raises
`InvalidArgument` whose message starts with the field's path (``expected_calls[1].tool: ...``).
What is not on the wire reads back as its default: ``options.timeout`` is the call's deadline,
an empty `Limits` and none are one (no field set), and so are an empty idempotency key and none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sandbox._proto import sandbox_pb2 as pb
from sandbox.codec.limits import limits_from_proto, limits_to_proto
from sandbox.codec.values import BACKEND_ENUM, BACKENDS, POLICIES, POLICY_ENUM
from sandbox.errors import InvalidArgument, quote
from sandbox.expectations import ExpectedCalls
from sandbox.files import InputFile, check_inputs
from sandbox.limits import CEILINGS, Limits
from sandbox.options import RunOptions
from sandbox.request_caps import check_labels, check_manifest_size, check_script_size

__all__ = [
    "MAX_EXPECTED_CALLS",
    "MAX_KEY_CHARS",
    "MAX_NAME_CHARS",
    "Request",
    "check_idempotency_key",
    "request_from_proto",
    "request_to_proto",
]

MAX_EXPECTED_CALLS = 256
MAX_NAME_CHARS = 256  # tool names, runtime names, ids
MAX_KEY_CHARS = 128  # an idempotency key: a uuid4 is 36
_IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no spaces
_NO_LIMITS = Limits()


@dataclass(frozen=True)
class Request:
    """One execution as asked for. ``manifest_json`` None: a session cell keeps its session's
    tools (a single-use execution without one has no tools)."""

    script: str
    manifest_json: str | None
    options: RunOptions = field(default_factory=RunOptions)


def request_to_proto(request: Request) -> pb.ExecuteRequest:
    """The request as the client sends it, refused before sending (with the message the server
    or the embedded engine would give) when it is larger than any server accepts: the script
    and manifest caps, and the input files under the ceilings (a tenant's may be lower, which
    only its server knows)."""
    options = request.options
    check_script_size(request.script)
    if request.manifest_json is not None:
        check_manifest_size(request.manifest_json)
    check_inputs(options.files, CEILINGS)
    check_labels(options.labels)
    message = pb.ExecuteRequest(
        script=request.script, labels=dict(options.labels), session_id=options.session_id
    )
    if request.manifest_json is not None:
        message.manifest.json = request.manifest_json
    if options.limits is not None:
        message.limits.CopyFrom(limits_to_proto(options.limits))
    if options.backend is not None:
        message.backend = BACKEND_ENUM[options.backend]
    if options.policy is not None:
        message.policy = POLICY_ENUM[options.policy]
    if options.runtime:
        message.runtime = options.runtime
    if options.idempotency_key:
        message.idempotency_key = options.idempotency_key
    for item in options.expected_calls:
        entry = message.expected_calls.add(tool=item.tool)
        if item.min is not None:
            entry.min = item.min
        if item.max is not None:
            entry.max = item.max
    for input_file in options.files:
        message.input_files.add(name=input_file.name, content=input_file.data)
    return message


def request_from_proto(message: pb.ExecuteRequest) -> Request:
    """The request as the server reads it, every field checked (input files' names and sizes
    against the tenant's limits are the engine's to check). It runs for every request a server
    serves: each field is read from the message once, and checked once (`RunOptions` is then
    given names its own checks pass)."""
    backend, policy, runtime = message.backend, message.policy, message.runtime
    if backend and backend not in BACKENDS:
        raise InvalidArgument(f"backend: unknown value {backend}")
    if policy and policy not in POLICIES:
        raise InvalidArgument(f"policy: unknown value {policy}")
    if len(runtime) > MAX_NAME_CHARS:
        raise InvalidArgument(f"runtime: longer than {MAX_NAME_CHARS} characters")
    labels = message.labels
    if labels:
        check_labels(labels)
    limits = limits_from_proto(message.limits) if message.HasField("limits") else None
    options = RunOptions(
        # Most requests leave the repeated and map fields empty: asking one for its length is
        # cheap, iterating it even empty is not (~2.5 us each).
        limits=None if limits is None or limits == _NO_LIMITS else limits,
        backend=BACKENDS.get(backend),
        runtime=runtime or None,
        policy=POLICIES.get(policy),
        expected_calls=_expected_calls(message) if message.expected_calls else (),
        files=tuple(InputFile(f.name, f.content) for f in message.input_files)
        if message.input_files
        else (),
        labels=labels,  # copied once, by `RunOptions`
        session_id=message.session_id,
        idempotency_key=check_idempotency_key(message.idempotency_key) or None,
    )
    manifest = message.manifest.json if message.HasField("manifest") else None
    return Request(message.script, manifest, options)


def _expected_calls(message: pb.ExecuteRequest) -> tuple[ExpectedCalls, ...]:
    if len(message.expected_calls) > MAX_EXPECTED_CALLS:
        raise InvalidArgument(f"expected_calls: more than {MAX_EXPECTED_CALLS} entries")
    expected: list[ExpectedCalls] = []
    for index, item in enumerate(message.expected_calls):
        where = f"expected_calls[{index}]"
        if not item.tool:
            raise InvalidArgument(f"{where}.tool: is empty")
        if len(item.tool) > MAX_NAME_CHARS:
            raise InvalidArgument(f"{where}.tool: longer than {MAX_NAME_CHARS} characters")
        low = item.min if item.HasField("min") else None
        high = item.max if item.HasField("max") else None
        if low is not None and high is not None and low > high:
            raise InvalidArgument(f"{where}: min {low} is above max {high}")
        expected.append(ExpectedCalls(item.tool, low, high))
    return tuple(expected)


def check_idempotency_key(key: str) -> str:
    """``key`` when it is a usable idempotency key (or empty), else `InvalidArgument`."""
    if len(key) > MAX_KEY_CHARS:
        raise InvalidArgument(
            f"idempotency_key: longer than {MAX_KEY_CHARS} characters ({quote(key)})"
        )
    if key and not _IDEMPOTENCY_KEY.fullmatch(key):
        raise InvalidArgument(
            f"idempotency_key: {quote(key)} has a character outside printable ASCII (or a space)"
        )
    return key
