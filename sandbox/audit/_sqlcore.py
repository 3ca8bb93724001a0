"""The SQL audit store: one class made of its roles, over a tiny DB seam.

SQLite and PostgreSQL differ only in how a connection is opened, how a write transaction is
serialised and how a snapshot read is taken; `sandbox.audit._db.Db` is that seam, and what
differs is stated once as a typed value (`Engine`). Each role of the store is a module of its
own, each a class over the chain appends (`sandbox.audit._chain.Chain`):

- records and queries (`_records.Records`): admit, complete, get, list, find, by_key;
- upkeep (`_upkeep.Upkeep`): verify, prune, what checkpoints read;
- the fleet (`_leases.Leases`): leases, dead servers, holders, the shared secret;
- sessions (`_handover.SessionMoves`): hand-over, take-over, typed session rows.

Callers use the store through the protocols of `sandbox.audit.base` (`AuditStore`,
`SessionHolding`, `SessionRows`), which it implements, never by probing for attributes.
"""

from __future__ import annotations

from sandbox.audit._db import Db, Engine, Tx
from sandbox.audit._handover import SessionMoves
from sandbox.audit._leases import Leases
from sandbox.audit._records import Records
from sandbox.audit._upkeep import Upkeep

__all__ = ["Db", "Engine", "SqlAuditStore", "Tx"]


class SqlAuditStore(Records, Upkeep, Leases, SessionMoves):
    """An `AuditStore` (with `SessionHolding` and `SessionRows`) over any `Db`."""

    holds_sessions = True  # a session's record moves between servers (`SessionMoves`)
