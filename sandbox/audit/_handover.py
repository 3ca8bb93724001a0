"""The sessions role of the SQL audit store: sessions that move between servers, and their rows.

A draining server hands its open session records over (`hand_over`); the server that rebuilds
one takes it over (`take_over`, a compare-and-set on the record's holder under the tenant's chain
lock); `session` reads a session's typed row (`sandbox.audit._sessions`).
"""

from __future__ import annotations

from sandbox.audit import _sessions
from sandbox.audit._chain import Chain, now_us
from sandbox.audit._codec import canonical
from sandbox.audit.base import SessionRecord

__all__ = ["SessionMoves"]


class SessionMoves(Chain):
    """Handing sessions over and taking them over; their rows."""

    def hand_over(self, execution_id: str, reason: str) -> bool:
        """A draining server lets go of a session it holds: its record becomes `interrupted`
        with ``reason`` and ``handed_over`` (left open, not ended), so that any server may take
        it over (`take_over`). False when the record is not this server's running one."""
        payload = canonical({"reason": reason, "instance": self.instance, "handed_over": True})
        with self._db.write() as tx:
            tenant = self._tenant_of(tx, execution_id)
            head = self._lock_head(tx, tenant)
            still = tx.execute(
                "SELECT 1 FROM executions WHERE execution_id = ? AND status = 'running' "
                "AND instance = ?",
                (execution_id, self.instance),
            )
            if not still:
                return False
            entry = self._append(tx, tenant, "interrupted", execution_id, payload, head)
            self._reindex(tx, tenant, execution_id, entry, None)
        return True

    def take_over(self, tenant: str, execution_id: str) -> str | None:
        """Takes the open record ``execution_id`` (a session) for this server, if its holder
        let go of it: the record is `interrupted` (handed over, swept as dead, or marked by a
        restart), or `running` under a holder whose fleet lease expired. A compare-and-set on
        the record's instance under the tenant's chain lock, so exactly one server takes it;
        the take-over is an entry of the chain (``taken_over``, naming both servers). Returns
        the previous holder, or None when the record is not takeable (ended, unknown, another
        tenant's, or held by a live server)."""
        now = now_us()
        with self._db.write() as tx:
            head = self._lock_head(tx, tenant)
            rows = tx.execute(
                "SELECT instance, status FROM executions WHERE execution_id = ? AND tenant = ?",
                (execution_id, tenant),
            )
            if not rows:
                return None
            holder, status = str(rows[0][0]), str(rows[0][1])
            if status == "running":
                alive = tx.execute(
                    "SELECT 1 FROM fleet_members WHERE instance = ? AND expires_at_us >= ?",
                    (holder, now),
                )
                if alive or holder == self.instance:
                    return None
            elif status != "interrupted":
                return None
            # The compare-and-set: only while the row still names the holder read above.
            moved = tx.execute(
                "UPDATE executions SET instance = ? WHERE execution_id = ? AND instance = ? "
                "AND status = ? RETURNING execution_id",
                (self.instance, execution_id, holder, status),
            )
            if not moved:
                return None
            tx.execute(
                "UPDATE sessions SET holder = ? WHERE tenant = ? AND session_id = ?",
                (self.instance, tenant, execution_id),
            )
            payload = canonical({"instance": self.instance, "from": holder, "at_us": now})
            entry = self._append(tx, tenant, "taken_over", execution_id, payload, head)
            self._reindex(tx, tenant, execution_id, entry, None)
        return holder

    def session(self, tenant: str, session_id: str) -> SessionRecord | None:
        """The tenant's session row (`sandbox.audit._sessions`), or None."""
        return _sessions.read_row(self._db.read_one(_sessions.SELECT_ROW, (tenant, session_id)))
