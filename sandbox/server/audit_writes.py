"""The server's write path to the audit store, and what it does when the store refuses writes.

`AuditWrites` wraps the server's `AuditStore` (reads pass straight through) and owns three rules:

- **Nothing runs unrecorded.** An admission the store refuses (`StoreUnavailable`: a full disk,
  a read-only file or database, PostgreSQL down) is UNAVAILABLE naming the store's error, and
  the execution never starts.
- **A finished execution is never left `running`.** A completion the store refuses is kept in
  memory, oldest first, and written when the store takes writes again (`recover`, which the
  readiness check calls every second while the store is failing). At most
  `MAX_PENDING_COMPLETIONS` are kept; one more is dropped with an error in the log, counted in
  ``ptc_audit_completions_dropped_total``, and stays `running` until the server's next start
  marks it `interrupted`. Kept completions live in memory only: a server that also dies before
  the store returns loses them, and its next start (same ``--instance-id``) marks those records
  `interrupted`.
- **A server whose store fails leaves the rotation.** From the first refused write until a write
  succeeds again, `failure` names the store's error and readiness is NOT_SERVING. While
  completions wait, no new execution is admitted (UNAVAILABLE), which also bounds the wait list
  by the executions that were in flight. With none waiting, `recover` writes a probe row
  (`SqlAuditStore.write_probe`, padded to `PROBE_PAD_BYTES`, about a completion's size: on a
  nearly full disk a tiny write can still fit where a real one does not).

The execution's caller gets its result either way: the script ran, and its record follows.
"""

from __future__ import annotations

import builtins
import collections
import logging
import threading

from sandbox.audit.base import (
    Admission,
    AuditQuery,
    AuditRecord,
    AuditStore,
    DeadServer,
    Holder,
    Member,
    SessionHolding,
    SessionRecord,
    SessionRows,
    VerifyReport,
)
from sandbox.errors import PtcError, StoreUnavailable
from sandbox.result import ExecutionResult
from sandbox.telemetry import metrics

__all__ = ["MAX_PENDING_COMPLETIONS", "PROBE_PAD_BYTES", "AuditWrites"]

log = logging.getLogger(__name__)
MAX_PENDING_COMPLETIONS = 1024
PROBE_PAD_BYTES = 64 * 1024


class AuditWrites:
    """An `AuditStore` that keeps refused completions and tracks whether writes succeed."""

    def __init__(self, store: AuditStore, *, max_pending: int = MAX_PENDING_COMPLETIONS) -> None:
        self.store = store
        self.max_pending = max_pending
        self.failure: str | None = None  # the store's latest refusal, until a write succeeds
        self._pending: collections.OrderedDict[str, ExecutionResult] = collections.OrderedDict()
        # `recover` runs in a worker thread while executions complete in others. The gauge is set
        # under the lock too: set after it, a `_keep` could write its count over the 0 that a
        # `recover` on another thread had just set, and the gauge would stay stale.
        self._lock = threading.Lock()

    @property
    def pending(self) -> int:
        """Completions kept because the store refused them, not yet written."""
        with self._lock:
            return len(self._pending)

    # -- writes ------------------------------------------------------------------------------

    def admit(self, admission: Admission) -> None:
        waiting = self.pending
        if waiting:
            raise StoreUnavailable(
                f"execution not admitted: the audit store refuses writes ({self.failure}); "
                f"{waiting} finished executions wait to be recorded first"
            )
        try:
            self.store.admit(admission)
        except StoreUnavailable as exc:
            self._failed("admit", exc)
            raise StoreUnavailable(f"execution not admitted: {exc.message}") from exc
        self._succeeded()

    def complete(self, execution_id: str, result: ExecutionResult) -> None:
        try:
            self.store.complete(execution_id, result)
        except StoreUnavailable as exc:
            self._failed("complete", exc)
            self._keep(execution_id, result, exc)
            return
        self._succeeded()

    def _keep(self, execution_id: str, result: ExecutionResult, exc: StoreUnavailable) -> None:
        with self._lock:
            if len(self._pending) >= self.max_pending:
                dropped = True
            else:
                dropped = False
                self._pending[execution_id] = result
            waiting = len(self._pending)
            metrics.audit_pending(waiting)
        if dropped:
            metrics.audit_completion_dropped()
            log.error(
                "audit: the record of execution %s could not be completed (%s) and %d others "
                "already wait: it stays `running` until this server's next start marks it "
                "`interrupted`",
                execution_id,
                exc.message,
                waiting,
            )
        else:
            log.warning(
                "audit: the record of execution %s could not be completed (%s); kept, with %d "
                "waiting, until the store takes writes again",
                execution_id,
                exc.message,
                waiting,
            )

    def _failed(self, operation: str, exc: StoreUnavailable) -> None:
        metrics.audit_write_failed(operation)
        if self.failure is None:
            log.error("audit: the store refuses writes: %s", exc.message)
        self.failure = exc.message

    def _succeeded(self) -> None:
        if self.failure is not None and not self.pending:
            log.warning("audit: the store takes writes again")
            self.failure = None

    def recover(self) -> bool:
        """Writes the kept completions, oldest first, or else a probe; True when the store
        took them (and `failure` is cleared). Blocking: run it in a worker thread."""
        while True:
            with self._lock:
                first = next(iter(self._pending.items()), None)
            if first is None:
                break
            execution_id, result = first
            try:
                self.store.complete(execution_id, result)
            except StoreUnavailable as exc:
                self.failure = exc.message
                return False
            except PtcError as exc:  # completed meanwhile, or gone: nothing left to write
                log.error("audit: the kept record of execution %s: %s", execution_id, exc.message)
            else:
                log.warning("audit: the kept record of execution %s is now complete", execution_id)
            with self._lock:
                self._pending.pop(execution_id, None)
                metrics.audit_pending(len(self._pending))
        if self.failure is not None:
            try:
                self.store.write_probe(PROBE_PAD_BYTES)
            except StoreUnavailable as exc:
                self.failure = exc.message
                return False
        self._succeeded()
        return True

    def abandon(self) -> builtins.list[str]:
        """At shutdown, after a last `recover`: the executions whose records stay `running`."""
        with self._lock:
            ids = list(self._pending)
            self._pending.clear()
            metrics.audit_pending(0)
        return ids

    # -- everything else passes through ------------------------------------------------------

    def get(self, tenant: str, execution_id: str) -> AuditRecord | None:
        return self.store.get(tenant, execution_id)

    def by_key(self, tenant: str, key: str) -> str | None:
        return self.store.by_key(tenant, key)

    def list(self, tenant: str, query: AuditQuery) -> tuple[builtins.list[AuditRecord], str | None]:
        return self.store.list(tenant, query)

    def mark_interrupted(self) -> int:
        return self.store.mark_interrupted()

    def heartbeat(self, address: str, ttl_s: float) -> None:
        self.store.heartbeat(address, ttl_s)

    def leave(self) -> None:
        self.store.leave()

    def sweep_dead(self) -> builtins.list[DeadServer]:
        return self.store.sweep_dead()

    def holder(self, tenant: str, session_id: str) -> Holder | None:
        return self.store.holder(tenant, session_id)

    def members(self) -> builtins.list[Member]:
        return self.store.members()

    def fleet_secret(self) -> str:
        return self.store.fleet_secret()

    def verify(self, tenant: str | None = None) -> VerifyReport:
        return self.store.verify(tenant)

    @property
    def quick_reads(self) -> bool:
        """Whether a short read of the store may run on the event loop (`SQLiteAuditStore`)."""
        return self.store.quick_reads

    # A store that can move sessions between servers (`SessionHolding`): the SQL stores.
    @property
    def holds_sessions(self) -> bool:
        return isinstance(self.store, SessionHolding)

    def hand_over(self, execution_id: str, reason: str) -> bool:
        assert isinstance(self.store, SessionHolding)
        return self.store.hand_over(execution_id, reason)

    def take_over(self, tenant: str, execution_id: str) -> str | None:
        assert isinstance(self.store, SessionHolding)
        return self.store.take_over(tenant, execution_id)

    def session(self, tenant: str, session_id: str) -> SessionRecord | None:
        """The store's typed session row; None from a store without them (the in-memory one)."""
        if isinstance(self.store, SessionRows):
            return self.store.session(tenant, session_id)
        return None

    @property
    def instance(self) -> str:
        return self.store.instance

    def write_probe(self, pad_bytes: int = 0) -> None:
        self.store.write_probe(pad_bytes)

    def schema_version(self) -> int:
        return self.store.schema_version()

    def find(self, execution_id: str) -> AuditRecord | None:
        return self.store.find(execution_id)

    def close(self) -> None:
        self.store.close()
