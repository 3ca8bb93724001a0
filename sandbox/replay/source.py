"""What a record must hold to be replayed, and the request that replays it.

A replay needs the script, the manifest as given, the effective limits in the proto's units,
the backend, the runtime, the script policy, the expected call counts, and a result whose call
log answers the tool calls. Records written before expected calls were recorded, records that
kept only the manifest's hash, and records with no result (still running, or interrupted)
cannot be replayed: `recording_from` raises `FailedPrecondition` naming everything that is
missing. A record written before runtimes were recorded replays on the standard library.

A record whose limits are in an older format (`sandbox.older_limits`: limit names in seconds, or
only some of today's limits) replays under them, each converted to its field, and under today's
default for each limit it does not hold; `Recording.defaulted_limits` names those, and the
replay's report says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sandbox.audit.base import AuditRecord
from sandbox.engine import ExecutionRequest
from sandbox.errors import FailedPrecondition
from sandbox.expectations import ExpectedCalls
from sandbox.limits import SPEC_BY_NAME, Limits
from sandbox.older_limits import limits_json
from sandbox.result import ExecutionResult

__all__ = ["Recording", "recording_from"]


@dataclass(frozen=True)
class Recording:
    """A replayable record."""

    execution_id: str
    tenant: str
    script: str
    manifest_json: str
    backend: str
    policy: str
    limits: Limits  # the recorded effective limits, as a request
    expected_calls: tuple[ExpectedCalls, ...]
    result: ExecutionResult
    runtime: str = ""  # "": the standard library
    # The limits the record does not hold (an older format), which run at today's defaults.
    defaulted_limits: tuple[str, ...] = ()

    def request(
        self,
        *,
        manifest: str | None = None,
        limits: Limits | None = None,
        backend: str | None = None,
    ) -> ExecutionRequest:
        """The request that replays it: the recorded one, with any given manifest, limits
        (field by field over the recorded ones) or backend instead."""
        policy: Literal["none", "restricted"] = (
            "restricted" if self.policy == "restricted" else "none"
        )
        return ExecutionRequest(
            script=self.script,
            manifest=self.manifest_json if manifest is None else manifest,
            limits=self.limits.merged(limits) if limits is not None else self.limits,
            backend=backend or self.backend,
            policy=policy,
            expected_calls=self.expected_calls,
            replay_of=self.execution_id,
            runtime=self.runtime or None,
        )

    def defaulted(self, limits: Limits | None = None) -> list[str]:
        """The limits the record does not hold that the replay runs at today's defaults: those
        of `defaulted_limits` that ``limits`` (given instead of the recorded ones) leaves unset."""
        return [
            name
            for name in self.defaulted_limits
            if limits is None or getattr(limits, SPEC_BY_NAME[name].field) is None
        ]


def recording_from(record: AuditRecord) -> Recording:
    """The record as a `Recording`; raises `FailedPrecondition` naming what it lacks."""
    admission = record.admission
    missing: list[str] = []
    if admission.expected_calls is None:
        missing.append(
            "the expected call counts (expected_calls; it was recorded before replay support)"
        )
    if not admission.manifest_json:
        missing.append("the manifest's text (only its hash was kept)")
    older = admission.older_limits
    if admission.effective_limits is None and older is None:
        missing.append(
            "every effective limit in the proto's units (it was recorded in an older format)"
        )
    if record.result is None:
        missing.append(f"a result with the tool calls' outcomes (its status is {record.status})")
    if missing or record.result is None:
        raise FailedPrecondition(
            f"execution {admission.execution_id} cannot be replayed: its record lacks "
            + "; ".join(missing)
        )
    defaulted: tuple[str, ...] = ()
    if admission.effective_limits is None and older is not None:
        limits, defaulted = older.as_request(), older.unrecorded()
    else:
        limits = Limits.from_mapping(
            limits_json(admission.effective_limits), where="recorded effective_limits"
        )
    return Recording(
        execution_id=admission.execution_id,
        tenant=admission.tenant,
        script=admission.script,
        manifest_json=admission.manifest_json,
        backend=admission.backend,
        policy=admission.policy,
        limits=limits,
        expected_calls=tuple(admission.expected_calls or ()),
        result=record.result,
        runtime=admission.runtime,
        defaulted_limits=defaulted,
    )
