"""The `Replay` RPC: a recorded execution of the caller's tenant, re-run with its tool calls
answered from the record (`sandbox.replay`), admitted and recorded like any execution.

Only the caller's own records are found (another tenant's id is NOT_FOUND, as for
`GetExecution`). The tenant's backends, ceilings and admission (concurrency, queue, rate) apply;
its allowed tool modes and the server's host handlers do not, since a replay runs no tool:
`client`-mode tools are answered from the record as well, so the unary RPC serves them.
"""

from __future__ import annotations

import asyncio

from sandbox._proto import sandbox_pb2 as pb
from sandbox.codec.limits import limits_from_proto
from sandbox.codec.replay import report_to_proto
from sandbox.codec.values import BACKENDS
from sandbox.engine import RunHooks
from sandbox.errors import InvalidArgument, NotFound, quote
from sandbox.replay.dispatch import ReplayDispatch
from sandbox.replay.run import report
from sandbox.replay.source import recording_from
from sandbox.server.runner import Prepared, Runner
from sandbox.tenants.base import Tenant
from sandbox.tenants.policy import check_backend, check_runtime, effective_limits

__all__ = ["serve_replay"]


async def serve_replay(
    runner: Runner, tenant: Tenant, message: pb.ReplayRequest
) -> pb.ReplayReport:
    if not message.execution_id:
        raise InvalidArgument("execution_id: is empty")
    if message.backend and message.backend not in BACKENDS:
        raise InvalidArgument(f"backend: unknown value {message.backend}")
    record = runner.store.get(tenant.id, message.execution_id)
    if record is None:
        raise NotFound(f"execution_id: no execution {quote(message.execution_id)}")
    recording = recording_from(record)
    given = limits_from_proto(message.limits)
    request = recording.request(
        manifest=message.manifest.json if message.HasField("manifest") else None,
        limits=given,
        backend=BACKENDS.get(message.backend),
    )
    check_backend(tenant, request.backend or runner.engine.config.default_backend)
    check_runtime(
        tenant, request.runtime, runner.runtimes.exists
    )  # the tenant may have lost it since
    execution = runner.engine.prepare(request, limits=effective_limits(tenant, request.limits))
    dispatch = ReplayDispatch(recording.result.calls)
    cancel = asyncio.Event()
    hooks = RunHooks(handlers=dispatch.handlers(), approver=dispatch.approve, cancel=cancel)
    run = runner.start(Prepared(tenant, execution), hooks)
    try:
        result = await asyncio.shield(run)
    except asyncio.CancelledError:  # deadline passed or the client went away
        cancel.set()
        raise
    return report_to_proto(report(recording, dispatch, result, given))
