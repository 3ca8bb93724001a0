"""The fleet role of the SQL audit store: leases, dead servers and their interrupted records.

A server renews its lease (``fleet_members``) with `heartbeat`; a survivor that finds an expired
lease takes its row (one survivor only) and marks the dead server's running records
`interrupted`, naming it and when it was last seen. The answers about the fleet (the holder of a
session, the members, the shared secret) are `sandbox.audit._fleet`'s.
"""

from __future__ import annotations

import time

from sandbox.audit import _fleet
from sandbox.audit._chain import Chain, now_us
from sandbox.audit._codec import canonical
from sandbox.audit.base import DeadServer, Holder, Member

__all__ = ["Leases"]


class Leases(Chain):
    """The store's part in the fleet."""

    def mark_interrupted(self) -> int:
        return self._mark_interrupted(
            self.instance, "the server stopped before the execution ended"
        )

    def heartbeat(self, address: str, ttl_s: float) -> None:
        now = now_us()
        with self._db.write() as tx:
            tx.execute(
                "INSERT INTO fleet_members (instance, address, seen_at_us, expires_at_us) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (instance) DO UPDATE SET "
                "address = excluded.address, seen_at_us = excluded.seen_at_us, "
                "expires_at_us = excluded.expires_at_us",
                (self.instance, address, now, now + int(ttl_s * 1_000_000)),
            )

    def leave(self) -> None:
        with self._db.write() as tx:
            tx.execute("DELETE FROM fleet_members WHERE instance = ?", (self.instance,))

    def sweep_dead(self) -> list[DeadServer]:
        now = now_us()
        with self._db.read() as tx:
            expired = tx.execute(
                "SELECT instance FROM fleet_members WHERE expires_at_us < ? AND instance <> ?",
                (now, self.instance),
            )
        dead: list[DeadServer] = []
        for (instance,) in expired:
            # Only the survivor whose DELETE takes the row sweeps it; a server that renewed its
            # lease meanwhile (it was slow, not dead) keeps its row and its records.
            with self._db.write() as tx:
                taken = tx.execute(
                    "DELETE FROM fleet_members WHERE instance = ? AND expires_at_us < ? "
                    "RETURNING address, seen_at_us",
                    (instance, now),
                )
            if not taken:
                continue
            address, seen_at_us = str(taken[0][0]), int(taken[0][1])
            seen = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seen_at_us / 1e6))
            reason = (
                f"the server that held it ({instance} at {address}) stopped responding at {seen}"
            )
            marked = self._mark_interrupted(str(instance), reason)
            dead.append(DeadServer(str(instance), address, seen_at_us / 1e6, marked))
        return dead

    def holder(self, tenant: str, session_id: str) -> Holder | None:
        return _fleet.holder(self._db, tenant, session_id)

    def members(self) -> list[Member]:
        return _fleet.members(self._db, self.instance)

    def fleet_secret(self) -> str:
        return _fleet.fleet_secret(self._db)

    def _mark_interrupted(self, instance: str, why: str) -> int:
        """Marks ``instance``'s running records `interrupted`, each in its own transaction
        under its tenant's chain head (a record completed meanwhile is left as it is)."""
        with self._db.read() as tx:
            running = tx.execute(
                "SELECT execution_id, tenant FROM executions "
                "WHERE status = 'running' AND instance = ? ORDER BY tenant, admit_seq",
                (instance,),
            )
        marked = 0
        reason = canonical({"reason": why, "instance": instance})
        for execution_id, tenant in running:
            with self._db.write() as tx:
                head = self._lock_head(tx, tenant)
                still = tx.execute(
                    "SELECT 1 FROM executions WHERE execution_id = ? AND status = 'running'",
                    (execution_id,),
                )
                if not still:
                    continue
                entry = self._append(tx, tenant, "interrupted", execution_id, reason, head)
                self._reindex(tx, tenant, execution_id, entry, None)
                marked += 1
        return marked
