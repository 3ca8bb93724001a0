"""What one execution runs: the request as given, and as prepared once by `Engine.prepare`.

`ExecutionRequest` is what a caller asks for; `PreparedExecution` is that request after every
check, with its limits resolved once (what `Engine.run` runs and what the recorder admits);
`StartedInfo` is what ``on_started`` sees when the sandbox is there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sandbox.expectations import ExpectedCalls
from sandbox.files import InputFile
from sandbox.limits import LimitAdjustment, Limits, ResolvedLimits
from sandbox.result import ScriptError
from sandbox.telemetry.progress import LiveProbe
from stubs_gen import Manifest

__all__ = ["ExecutionRequest", "PreparedExecution", "StartedInfo"]


@dataclass(frozen=True)
class ExecutionRequest:
    script: str
    manifest: str | bytes | list[Any] | dict[str, Any] | Manifest = "[]"
    limits: Limits = field(default_factory=Limits)
    backend: str | None = None
    policy: Literal["none", "restricted"] = "none"
    expected_calls: tuple[ExpectedCalls, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    # A runtime with third-party packages (`sandbox.runtimes`); None: the standard library.
    runtime: str | None = None
    # Set only by `sandbox.replay`: the recorded execution this one replays (audited with it).
    replay_of: str = ""
    # Placed in the script's working directory, read-only (see `sandbox.files`).
    files: tuple[InputFile, ...] = ()
    # At most one admission per tenant and key (`sandbox.server.idempotency`); "": none.
    idempotency_key: str = ""


@dataclass(frozen=True)
class StartedInfo:
    execution_id: str
    limits: ResolvedLimits
    isolation: list[str]
    probe: LiveProbe | None = None  # how far it has got, for live progress


@dataclass(frozen=True)
class PreparedExecution:
    """A request that passed every check, with its limits resolved once: what `Engine.run` runs
    and what the recorder admits. Built only by `Engine.prepare`."""

    execution_id: str
    request: ExecutionRequest  # its manifest parsed, its backend named
    manifest: Manifest
    manifest_json: str  # as given, for the audit record
    backend: str
    limits: ResolvedLimits
    adjustments: tuple[LimitAdjustment, ...]
    rejection: ScriptError | None  # syntax or policy: `run` returns `rejected`, no sandbox
    runtime: str | None = None  # checked usable by the backend; None: the standard library
