"""A cell within its session: what an execution sent to a session runs as, and under which
limits. Pure rules over a `Session` and a request, the same for every path that runs cells (the
server's unary and streamed calls, the embedded SDK, a rebuild's replayed cells):

- `cell_request`: a cell runs on its session's backend and in its runtime (naming another is
  refused), keeps its session's manifest unless it brings one (which then replaces it), and
  carries its session's id as the label ``ptc.session_id`` (`SESSION_LABEL`);
- `cell_limits`: memory, processes, file size and open files are the whole sandbox's, fixed at
  CreateSession (`SESSION_FIELDS`): a cell asking more gets the session's, reported as an
  adjustment (action ``session``), one asking less is refused; a cell's CPU time is at most
  the session's.
"""

from __future__ import annotations

from dataclasses import replace

from sandbox.engine import ExecutionRequest
from sandbox.errors import InvalidArgument, InvalidLimits
from sandbox.limits import SPEC_BY_FIELD, LimitAdjustment, Limits, ResolvedLimits
from sandbox.request_caps import SESSION_LABEL
from sandbox.runtimes.store import DEFAULT_RUNTIME
from sandbox.sessions.session import Session

__all__ = ["SESSION_FIELDS", "cell_limits", "cell_request"]

# The limits of the whole sandbox, fixed at CreateSession: a cell cannot change them.
SESSION_FIELDS = ("memory_bytes", "processes", "file_size_bytes", "open_files")


def cell_request(
    session: Session, request: ExecutionRequest, *, manifest_given: bool
) -> ExecutionRequest:
    """The request as it runs in ``session``: the session's backend, runtime and manifest
    (unless the request brings a new one, which replaces the session's `tools`), its
    label. A cell cannot move the session to another backend or runtime."""
    if request.backend not in (None, "", session.backend):
        raise InvalidArgument(
            f"backend: session {session.id!r} runs on {session.backend!r}, not {request.backend!r}"
        )
    runtime = None if request.runtime in (None, "", DEFAULT_RUNTIME) else request.runtime
    if runtime is not None and runtime != session.runtime:
        runs_in = f"runtime {session.runtime!r}" if session.runtime else "the standard library"
        raise InvalidArgument(
            f"runtime: session {session.id!r} runs in {runs_in}, not {runtime!r}; a "
            "session's runtime is chosen at CreateSession"
        )
    manifest: object = request.manifest if manifest_given else session.manifest
    return replace(
        request,
        manifest=manifest,  # type: ignore[arg-type]
        backend=session.backend,
        runtime=session.runtime,
        labels={**request.labels, SESSION_LABEL: session.id},
    )


def cell_limits(
    session: Session, limits: ResolvedLimits, requested: Limits | None = None
) -> tuple[ResolvedLimits, tuple[LimitAdjustment, ...]]:
    """An execution's effective limits with the session's whole-sandbox ones in force, and
    what that changed of ``requested`` (the request's own limits). A cell cannot tighten a
    limit of the whole sandbox, so asking for less than the session has is refused, never
    ignored; asking for more gets the session's, reported as an adjustment."""
    fixed = {name: getattr(session.settings.limits, name) for name in SESSION_FIELDS}
    adjustments: list[LimitAdjustment] = []
    for name, value in fixed.items():
        asked = getattr(requested, name) if requested is not None else None
        if asked is None or asked == value:
            continue
        spec = SPEC_BY_FIELD[name]
        if asked < value:
            raise InvalidLimits(
                f"limits.{spec.name}: {spec.describe(asked)} is below the "
                f"{spec.describe(value)} of session {session.id!r}, set for its whole "
                "sandbox at CreateSession; a cell cannot lower it"
            )
        adjustments.append(
            LimitAdjustment(spec.name, spec.to_human(asked), spec.to_human(value), "session")
        )
    cpu = min(limits.cpu_time_ms, session.settings.limits.cpu_time_ms)
    return replace(limits, cpu_time_ms=cpu, **fixed), tuple(adjustments)
