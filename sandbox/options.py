"""`RunOptions`: everything a caller says about one execution besides its script and its tools,
as one typed, frozen value carried unchanged from the SDK, the CLI and the execute tool to the
request.

    options = RunOptions.of(limits={"wall_time": 2}, policy="restricted")
    client.run(script, tools, options)                 # or client.run(script, tools, limits=...)
    ExecuteTool(runner, tools, options=options)

The SDK's methods take ``options`` and, for convenience, the same names as keyword arguments
(`RunOverrides`), which override it field by field through `RunOptions.of`, the one place that
turns what a caller has at hand (a mapping of limits, paths of input files) into the typed
fields. Like `sandbox.limits` and `sandbox.files`, this module is shared by the client and the
host and imports nothing of the server, the engine or the backends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, TypedDict, TypeVar, Unpack

from sandbox.backend_names import BACKEND_NAMES
from sandbox.errors import InvalidArgument
from sandbox.expectations import ExpectedCalls
from sandbox.files import FilesLike, InputFile, input_files
from sandbox.limits import Limits

__all__ = [
    "BACKEND_NAMES",
    "LimitsLike",
    "Policy",
    "RunOptions",
    "RunOverrides",
    "SessionOptions",
    "SessionOverrides",
]

Policy = Literal["none", "restricted"]
_POLICIES: tuple[Policy, ...] = ("none", "restricted")
# A mapping of limits: short names in human units (``{"wall_time": 2, "memory": "256m"}``),
# unit-named fields in canonical integers (``{"wall_time_ms": 2000}``): `Limits.from_mapping`.
LimitsLike = Limits | Mapping[str, int | float | str] | None


@dataclass(frozen=True)
class RunOptions:
    """How to run one script. None or empty: the default of whoever runs it (the server's
    tenant, a session's own backend and runtime, the embedded engine's defaults)."""

    # Asked for, capped by the tenant's ceilings (a session cell: within the session's).
    limits: Limits | None = None
    backend: str | None = None  # "process", "docker" or "gvisor"
    runtime: str | None = None  # `ptc runtime list`; None: the standard library only
    policy: Policy | None = None
    expected_calls: tuple[ExpectedCalls, ...] = ()
    files: tuple[InputFile, ...] = ()  # placed in the script's working directory, read-only
    labels: Mapping[str, str] = field(default_factory=dict)  # recorded with the execution
    timeout: float | None = None  # the RPC's deadline in seconds (the SDK's)
    session_id: str = ""  # run as this session's next cell
    # At most one execution per key (the server's); None: the SDK makes one per call and
    # reuses it on its retries. Give one to ask again for a call whose outcome stayed unknown.
    idempotency_key: str | None = None

    def __post_init__(self) -> None:
        if self.backend is not None and self.backend not in BACKEND_NAMES:
            raise InvalidArgument(
                f"backend: unknown backend {self.backend!r} (known: {', '.join(BACKEND_NAMES)})"
            )
        if self.policy is not None and self.policy not in _POLICIES:
            raise InvalidArgument(
                f"policy: unknown policy {self.policy!r} (known: {', '.join(_POLICIES)})"
            )
        _freeze(self)

    @classmethod
    def of(
        cls, options: RunOptions | None = None, /, **overrides: Unpack[RunOverrides]
    ) -> RunOptions:
        """``options`` (or the defaults) with each given override in place, from the loose
        forms callers have at hand: limits as ``{name: value}``, files as `FilesLike`."""
        return _override(options if options is not None else cls(), dict(overrides))


class RunOverrides(TypedDict, total=False):
    """`RunOptions`' fields as keyword arguments of the SDK, in the forms `RunOptions.of` takes."""

    limits: LimitsLike
    backend: str | None
    runtime: str | None
    policy: Policy | None
    expected_calls: Sequence[ExpectedCalls]
    files: FilesLike | None
    labels: Mapping[str, str] | None
    timeout: float | None
    session_id: str
    idempotency_key: str | None


@dataclass(frozen=True)
class SessionOptions:
    """How to create a session: its backend and runtime (every cell's), its whole-session
    limits (``cpu_time`` its total CPU) and how long it may live. None: the server's default."""

    limits: Limits | None = None
    backend: str | None = None
    runtime: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    idle_timeout: float | None = None  # seconds without an execution before it expires
    max_lifetime: float | None = None  # seconds from its creation
    max_executions: int | None = None

    def __post_init__(self) -> None:
        RunOptions(backend=self.backend)  # the same check, the same message
        object.__setattr__(self, "labels", _frozen_labels(self.labels))

    @classmethod
    def of(
        cls, options: SessionOptions | None = None, /, **overrides: Unpack[SessionOverrides]
    ) -> SessionOptions:
        """``options`` (or the defaults) with each given override in place."""
        return _override(options if options is not None else cls(), dict(overrides))


class SessionOverrides(TypedDict, total=False):
    """`SessionOptions`' fields as keyword arguments of the SDK."""

    limits: LimitsLike
    backend: str | None
    runtime: str | None
    labels: Mapping[str, str] | None
    idle_timeout: float | None
    max_lifetime: float | None
    max_executions: int | None


_NO_LABELS: Mapping[str, str] = MappingProxyType({})


def _frozen_labels(labels: Mapping[str, str]) -> Mapping[str, str]:
    """A read-only copy of ``labels``: a caller's dict changed later changes nothing here. Most
    have none, and share one empty mapping."""
    return MappingProxyType(dict(labels)) if labels else _NO_LABELS


def _freeze(options: RunOptions) -> None:
    """Makes ``options`` frozen all the way down. It runs for every request the server decodes,
    so what is already frozen (a tuple, no labels) is left as it is rather than copied."""
    object.__setattr__(options, "labels", _frozen_labels(options.labels))
    if type(options.expected_calls) is not tuple:
        object.__setattr__(options, "expected_calls", tuple(options.expected_calls))
    if type(options.files) is not tuple:
        object.__setattr__(options, "files", tuple(options.files))


_Options = TypeVar("_Options", RunOptions, SessionOptions)


def _override(base: _Options, overrides: dict[str, Any]) -> _Options:
    """``base`` with ``overrides`` in place, each turned into its field's type."""
    if not overrides:  # every call of the SDK without keywords: nothing to check or replace
        return base
    names = [f.name for f in dataclasses.fields(base)]
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r} (options: {', '.join(names)})")
    if "limits" in overrides:
        overrides["limits"] = _limits(overrides["limits"])
    if "files" in overrides:
        overrides["files"] = input_files(overrides["files"])
    if "expected_calls" in overrides:
        overrides["expected_calls"] = tuple(overrides["expected_calls"])
    if "labels" in overrides:
        overrides["labels"] = dict(overrides["labels"] or {})
    return dataclasses.replace(base, **overrides)


def _limits(limits: LimitsLike) -> Limits | None:
    if limits is None or isinstance(limits, Limits):
        return limits
    return Limits.from_mapping(limits)
