"""Idempotency keys on the server: a request whose key was already admitted runs nothing.

Behind a load balancer a client cannot tell an execution that never started from one whose
answer was lost on the way back (nginx ends a unary call that outlives its ``grpc_read_timeout``
with UNAVAILABLE while the server goes on running it; a server killed under an open stream
shows as INTERNAL). So the client sends a key with each logical execution and the same key with
every retry of it, and the server keeps the rule "at most one execution per tenant and key":

- The key is mapped to its execution in the admission's own transaction
  (`SqlAuditStore.admit`), under the tenant's chain-head lock, so two servers sharing the store
  that admit the same key at once serialise and the second raises `KeyTaken`.
- A request whose key is already mapped (looked up before anything runs, or caught as
  `KeyTaken` when two raced) gets that execution's result: `answer` reads the record through the
  shared store, whichever server runs it, and waits while it is `running`, polling, within the
  call's deadline and at most the execution's own wall-time limit plus `WAIT_GRACE_S` after its
  admission. Past that bound the outcome is still unknown: UNAVAILABLE saying so (asking again
  with the same key is safe). An execution whose server died is `interrupted` once a survivor
  sweeps it (`sandbox.server.fleet`); its answer is that status with the reason, never a rerun.
- The same key with another script or manifest is FAILED_PRECONDITION naming the key: a key
  names one request, and reusing it for another is a client bug worth reporting, not hiding.

Only what the store holds is answered: a replayed answer carries the recorded result (output
capped as the audit record caps it), not the output chunks a stream sent while it ran.
"""

from __future__ import annotations

import asyncio
import hashlib
import time

from sandbox._proto import sandbox_pb2 as pb
from sandbox.audit.base import AuditRecord, AuditStore
from sandbox.codec.record import record_to_proto
from sandbox.engine import Engine
from sandbox.errors import FailedPrecondition, StoreUnavailable, Unavailable, quote

__all__ = ["WAIT_GRACE_S", "admitted", "answer"]

WAIT_GRACE_S = 120.0  # past the wall-time limit: a completion that is kept while the store fails
POLL_FIRST_S = 0.05
POLL_MAX_S = 1.0


async def admitted(store: AuditStore, tenant: str, key: str) -> str | None:
    """The execution already admitted under the tenant's ``key``, or None (also for no key)."""
    if not key:
        return None
    try:
        if store.quick_reads:  # a local file or memory: no thread hop
            return store.by_key(tenant, key)
        return await asyncio.to_thread(store.by_key, tenant, key)  # a database that may be slow
    except StoreUnavailable as exc:
        # Said as an admission's refusal says it: this look-up comes first, nothing ran.
        raise StoreUnavailable(f"execution not admitted: {exc.message}") from exc


async def answer(
    store: AuditStore,
    engine: Engine,
    tenant: str,
    request: pb.ExecuteRequest,
    execution_id: str,
) -> pb.ExecutionResult:
    """The result of ``execution_id``, admitted under ``request``'s key, once it has ended.
    The call's deadline, when it passes first, cancels this wait (DEADLINE_EXCEEDED)."""
    key = request.idempotency_key
    record = await asyncio.to_thread(store.get, tenant, execution_id)
    if record is None:
        raise FailedPrecondition(
            f"idempotency_key: {quote(key)} was admitted as execution {execution_id}, whose "
            "record is gone (retention pruned it); use a new key to run the script again"
        )
    _same_request(engine, key, record, request)
    limits = record.admission.effective_limits
    wall_s = 0.0 if limits is None else limits.wall_time_ms / 1000
    ends_by = record.admission.admitted_at + wall_s + WAIT_GRACE_S
    delay = POLL_FIRST_S
    while record.status == "running":
        if time.time() > ends_by:
            raise Unavailable(
                f"idempotency_key: {quote(key)}: execution {execution_id} has not ended "
                f"{wall_s + WAIT_GRACE_S:.0f} s after its admission (its wall-time limit plus "
                f"{WAIT_GRACE_S:.0f} s); its outcome is unknown: ask again with the same key"
            )
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, POLL_MAX_S)
        fresh = await asyncio.to_thread(store.get, tenant, execution_id)
        if fresh is None:
            raise FailedPrecondition(
                f"idempotency_key: {quote(key)}: the record of execution {execution_id} "
                "vanished while waiting for it"
            )
        record = fresh
    result = record_to_proto(record).result
    if record.status == "interrupted" and not result.HasField("error"):
        result.error.CopyFrom(
            pb.ScriptError(
                type="Interrupted",
                message=(
                    f"execution {execution_id} (idempotency_key {quote(key)}) was interrupted "
                    f"before it ended: {record.interrupted_reason or 'its server stopped'}; "
                    "its outcome is unknown and it was not run again"
                ),
            )
        )
    return result


def _same_request(
    engine: Engine, key: str, record: AuditRecord, request: pb.ExecuteRequest
) -> None:
    script_sha = hashlib.sha256(request.script.encode("utf-8", "surrogatepass")).hexdigest()
    differs: list[str] = []
    if script_sha != record.script_sha256:
        differs.append("script")
    if (
        request.HasField("manifest")
        and engine.manifest(request.manifest.json).sha256 != record.admission.manifest_sha256
    ):
        differs.append("manifest")
    if differs:
        raise FailedPrecondition(
            f"idempotency_key: {quote(key)} was already used for execution "
            f"{record.admission.execution_id} with another {' and '.join(differs)}; a key names "
            "one request: use a new key for a new one"
        )
