"""The store's answers about the fleet: who holds a session, who is alive, the shared secret.

A session is a record of its own (``executions`` row, status `running` while it is open) whose
``instance`` column names the server that admitted it and holds its sandbox; ``fleet_members``
says where that server listens and until when its lease runs. Joining the two answers "which
server holds session S, where, and is it alive" in one indexed read (the primary keys of both).
The fleet secret is one row, inserted at random by the first server that asks (``ON CONFLICT DO
NOTHING``: two servers racing both read the winner's), and read back by every other.
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING

from sandbox.audit.base import Holder, Member

if TYPE_CHECKING:
    from sandbox.audit._db import Db

__all__ = ["fleet_secret", "holder", "members"]

SECRET_BYTES = 32


def _now_us() -> int:
    return time.time_ns() // 1000


def holder(db: Db, tenant: str, session_id: str) -> Holder | None:
    with db.read() as tx:
        rows = tx.execute(
            "SELECT e.instance, m.address, m.expires_at_us FROM executions e "
            "JOIN fleet_members m ON m.instance = e.instance "
            "WHERE e.execution_id = ? AND e.tenant = ? AND e.status = 'running'",
            (session_id, tenant),
        )
    if not rows:
        return None
    instance, address, expires_at_us = rows[0]
    return Holder(str(instance), str(address), int(expires_at_us) >= _now_us())


def members(db: Db, me: str) -> list[Member]:
    with db.read() as tx:
        rows = tx.execute(
            "SELECT instance, address FROM fleet_members "
            "WHERE instance <> ? AND expires_at_us >= ? ORDER BY instance",
            (me, _now_us()),
        )
    return [Member(str(instance), str(address), True) for instance, address in rows]


def fleet_secret(db: Db) -> str:
    with db.write() as tx:
        tx.execute(
            "INSERT INTO fleet_secret (id, secret) VALUES (1, ?) ON CONFLICT (id) DO NOTHING",
            (secrets.token_urlsafe(SECRET_BYTES),),
        )
        return str(tx.execute("SELECT secret FROM fleet_secret WHERE id = 1")[0][0])
