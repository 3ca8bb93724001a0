"""The audit store's schema and its ordered migrations, shared by SQLite and PostgreSQL.

The DDL uses only what both engines accept (``BIGINT``, ``DOUBLE PRECISION``, ``TEXT``,
composite primary keys, ``CREATE ... IF NOT EXISTS``), so one list of steps migrates either.
``schema_version`` holds one row per applied step; a store opens by applying, inside one write
transaction, every step above the highest recorded version, so a half-applied migration never
becomes visible and two servers opening the same store at once migrate it exactly once.

Tables: ``entries`` is the append-only hash chain (the source of truth); ``chain_heads`` holds
each tenant's last sequence number and hash (the row that chain appends lock); ``checkpoints``
anchors a chain whose prefix retention pruned; ``executions``, ``calls`` and ``violations`` are
query indexes derived from the entries, which `verify` recomputes and compares;
``pruned_leaves`` keeps the hash of every pruned entry (Merkle leaves: `sandbox.audit.merkle`);
``write_probes`` is scratch space where a server checks that the store takes writes again;
``fleet_members`` holds each live server's address and lease, ``fleet_secret`` the fleet's
shared secret; ``idempotency_keys`` maps each tenant's idempotency keys to the execution
admitted under one; ``merkle_frontiers`` the right edge of each tenant's Merkle tree at
each signed checkpoint's size; ``sessions`` each session as a typed row; ``contents`` the text
an admission names by its SHA-256 (its script and manifest) once per tenant, with the latest
entry that names each (`sandbox.audit._contents`).

A step is SQL statements, or a function of the open transaction where a step must compute
what SQL alone cannot say the same way on both engines (reading the JSON of old entries).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from sandbox.audit._db import Engine, Tx
from sandbox.request_caps import KIND_LABEL, SESSION_LABEL

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "PerEngine", "Step"]


@dataclass(frozen=True)
class PerEngine:
    """Statements that differ between the engines, where one engine has a structure the other
    lacks (a table without rowids; an index that carries a column); run in the step's
    transaction like any other."""

    sqlite: tuple[str, ...]
    postgresql: tuple[str, ...]

    def statements(self, engine: Engine) -> tuple[str, ...]:
        return self.sqlite if engine.name == "sqlite" else self.postgresql


Step = str | Callable[[Tx], None] | PerEngine

_V1 = (
    """CREATE TABLE IF NOT EXISTS entries (
        tenant TEXT NOT NULL,
        seq BIGINT NOT NULL,
        kind TEXT NOT NULL,
        execution_id TEXT NOT NULL,
        at_us BIGINT NOT NULL,
        payload TEXT NOT NULL,
        prev_hash TEXT NOT NULL,
        entry_hash TEXT NOT NULL,
        PRIMARY KEY (tenant, seq)
    )""",
    "CREATE INDEX IF NOT EXISTS entries_execution ON entries (tenant, execution_id)",
    """CREATE TABLE IF NOT EXISTS chain_heads (
        tenant TEXT PRIMARY KEY,
        seq BIGINT NOT NULL,
        head_hash TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS checkpoints (
        tenant TEXT PRIMARY KEY,
        seq BIGINT NOT NULL,
        entry_hash TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS executions (
        execution_id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        admit_seq BIGINT NOT NULL,
        status TEXT NOT NULL,
        admitted_at DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION,
        backend TEXT NOT NULL,
        script_sha256 TEXT NOT NULL,
        manifest_sha256 TEXT NOT NULL,
        instance TEXT NOT NULL,
        prev_hash TEXT NOT NULL,
        record_hash TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS executions_tenant_seq ON executions (tenant, admit_seq)",
    """CREATE INDEX IF NOT EXISTS executions_tenant_status
        ON executions (tenant, status, admit_seq)""",
    "CREATE INDEX IF NOT EXISTS executions_tenant_time ON executions (tenant, admitted_at)",
    "CREATE INDEX IF NOT EXISTS executions_running ON executions (status, instance)",
    """CREATE TABLE IF NOT EXISTS calls (
        execution_id TEXT NOT NULL,
        idx BIGINT NOT NULL,
        seq BIGINT NOT NULL,
        tenant TEXT NOT NULL,
        tool TEXT NOT NULL,
        status TEXT NOT NULL,
        PRIMARY KEY (execution_id, idx)
    )""",
    "CREATE INDEX IF NOT EXISTS calls_tenant_tool ON calls (tenant, tool, execution_id)",
    """CREATE TABLE IF NOT EXISTS violations (
        execution_id TEXT NOT NULL,
        idx BIGINT NOT NULL,
        tenant TEXT NOT NULL,
        limit_name TEXT NOT NULL,
        action TEXT NOT NULL,
        PRIMARY KEY (execution_id, idx)
    )""",
    """CREATE INDEX IF NOT EXISTS violations_tenant_limit
        ON violations (tenant, limit_name, execution_id)""",
)

# Version 2 (audit checkpoints): the hashes of entries retention pruned stay behind as the
# leaves of the tenant's Merkle tree, so signed checkpoints older than a prune still verify.
_V2 = (
    """CREATE TABLE IF NOT EXISTS pruned_leaves (
        tenant TEXT NOT NULL,
        seq BIGINT NOT NULL,
        entry_hash TEXT NOT NULL,
        PRIMARY KEY (tenant, seq)
    )""",
)

# Version 3 (a store that refuses writes): one row per server, rewritten by `write_probe`, so
# that a server that saw a write fail learns when writing works again without recording anything
# in the chain. Its padding makes the probe as large as a typical completion.
_V3 = (
    """CREATE TABLE IF NOT EXISTS write_probes (
        instance TEXT PRIMARY KEY,
        at_us BIGINT NOT NULL,
        pad TEXT NOT NULL
    )""",
)

# Version 4 (dead servers are noticed): one row per live server sharing the store, renewed by
# its heartbeat; a row whose lease expired is a dead server, whose running records a survivor
# marks `interrupted` (`SqlAuditStore.sweep_dead`).
_V4 = (
    """CREATE TABLE IF NOT EXISTS fleet_members (
        instance TEXT PRIMARY KEY,
        address TEXT NOT NULL,
        seen_at_us BIGINT NOT NULL,
        expires_at_us BIGINT NOT NULL
    )""",
)

# Version 5 (a retry never runs a script twice): each tenant's idempotency keys, each mapped to
# the one execution admitted under it, written in the admission's own transaction.
_V5 = (
    """CREATE TABLE IF NOT EXISTS idempotency_keys (
        tenant TEXT NOT NULL,
        idem_key TEXT NOT NULL,
        execution_id TEXT NOT NULL,
        PRIMARY KEY (tenant, idem_key)
    )""",
)

# Version 6 (any server serves any session): the fleet's shared secret, created once at random
# by the first server that needs it and read by every other; in a fleet without TLS client
# certificates a server carries calls to another with it (`sandbox.server.peers`). The row is
# as secret as the database's password.
_V6 = (
    """CREATE TABLE IF NOT EXISTS fleet_secret (
        id BIGINT PRIMARY KEY,
        secret TEXT NOT NULL
    )""",
)


def _fill_sessions(tx: Tx) -> None:
    """Sets ``executions.session_id`` from each admission's ``ptc.session_id`` label: one read
    of the admissions, once, where a list by session used to search their text every time."""
    found: list[tuple[str, str]] = []
    for execution_id, payload in tx.stream(
        "SELECT execution_id, payload FROM entries WHERE kind = 'admitted'"
    ):
        labels = json.loads(payload).get("labels")
        session = labels.get(SESSION_LABEL) if isinstance(labels, dict) else None
        if isinstance(session, str) and session:
            found.append((session, str(execution_id)))
    for start in range(0, len(found), 1000):
        tx.executemany(
            "UPDATE executions SET session_id = ? WHERE execution_id = ?",
            found[start : start + 1000],
        )


# Version 7 (every list filter an index answers): a session's cells are found through a typed
# column and an index, never a search of the admissions' JSON text; calls and violations rows
# carry their execution's ``admit_seq``, so a list by tool or violation walks its own index in
# page order (newest first) and stops at the page, instead of collecting every matching id.
_V7: tuple[Step, ...] = (
    "ALTER TABLE executions ADD COLUMN session_id TEXT",
    "ALTER TABLE calls ADD COLUMN admit_seq BIGINT",
    "ALTER TABLE violations ADD COLUMN admit_seq BIGINT",
    _fill_sessions,
    """UPDATE calls SET admit_seq = (
        SELECT e.admit_seq FROM executions e WHERE e.execution_id = calls.execution_id)""",
    """UPDATE violations SET admit_seq = (
        SELECT e.admit_seq FROM executions e WHERE e.execution_id = violations.execution_id)""",
    """CREATE INDEX IF NOT EXISTS executions_tenant_session
        ON executions (tenant, session_id, admit_seq)""",
    "DROP INDEX IF EXISTS calls_tenant_tool",
    "CREATE INDEX IF NOT EXISTS calls_tenant_tool_seq ON calls (tenant, tool, admit_seq)",
    "DROP INDEX IF EXISTS violations_tenant_limit",
    """CREATE INDEX IF NOT EXISTS violations_tenant_limit_seq
        ON violations (tenant, limit_name, admit_seq)""",
)

# Version 8 (a checkpoint costs what was appended since the last): the right edge of each
# tenant's Merkle tree at every size a checkpoint was signed at (`sandbox.audit.frontier`), from
# which the next checkpoint grows the tree and `verify --since-checkpoint` starts. A row is
# trusted only when its root is a signed checkpoint's.
_V8: tuple[Step, ...] = (
    """CREATE TABLE IF NOT EXISTS merkle_frontiers (
        tenant TEXT NOT NULL,
        tree_size BIGINT NOT NULL,
        nodes TEXT NOT NULL,
        last_hash TEXT NOT NULL,
        last_path TEXT NOT NULL,
        PRIMARY KEY (tenant, tree_size)
    )""",
)


def _fill_session_rows(tx: Tx) -> None:
    """One ``sessions`` row per session record already in the chain (`sandbox.audit._sessions`
    derives the row the same way when the entries are written)."""
    from sandbox.audit import _sessions

    sessions: dict[tuple[str, str], dict[str, object]] = {}
    for tenant, payload, instance in tx.stream(
        "SELECT e.tenant, e.payload, x.instance FROM entries e "
        "JOIN executions x ON x.execution_id = e.execution_id "
        "WHERE e.kind = 'admitted' AND e.payload LIKE ?",
        (f'%"{KIND_LABEL}":"session"%',),  # as the chain's canonical JSON writes the label
    ):
        data = json.loads(payload)
        sessions[(str(tenant), str(data["execution_id"]))] = {"data": data, "holder": instance}
    for (tenant, session_id), found in sessions.items():
        data = found["data"]
        assert isinstance(data, dict)
        _sessions.insert_row(tx, tenant, data, str(found["holder"]))
        done = tx.execute(
            "SELECT payload FROM entries WHERE tenant = ? AND execution_id = ? "
            "AND kind = 'completed' ORDER BY seq DESC LIMIT 1",
            (tenant, session_id),
        )
        if done:
            _sessions.record_end(tx, tenant, session_id, json.loads(done[0][0]))


# Version 9 (sessions as typed rows): a session's settings, state, holder and end in columns of
# their own, written with the session record's entries, instead of labels parsed back by key.
_V9: tuple[Step, ...] = (
    """CREATE TABLE IF NOT EXISTS sessions (
        tenant TEXT NOT NULL,
        session_id TEXT NOT NULL,
        state TEXT NOT NULL,
        end_reason TEXT NOT NULL,
        holder TEXT NOT NULL,
        backend TEXT NOT NULL,
        runtime TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        ended_at DOUBLE PRECISION,
        idle_timeout_ms BIGINT NOT NULL,
        max_lifetime_ms BIGINT NOT NULL,
        max_executions BIGINT NOT NULL,
        PRIMARY KEY (tenant, session_id)
    )""",
    _fill_session_rows,
)

# Version 10 (what repeats is stored once): an admission written from now on names its script and
# manifest by their SHA-256 and their text is a ``contents`` row, written once per tenant
# (`sandbox.audit._contents`), with the latest entry naming it (``last_seq``), which is what
# retention removes rows by. Entries written before stay as they are, text inline: an entry's
# hash covers its payload's exact bytes, and every entry's hash is a leaf of its tenant's Merkle
# tree and the link the next entry carries, so rewriting an old payload would change every
# later hash and break each signed checkpoint an auditor already holds. Readers and `verify`
# take both forms (`_contents.references`: an entry without ``by_digest`` holds its text), and
# the old entries leave the store as retention prunes them.
_V10: tuple[Step, ...] = (
    """CREATE TABLE IF NOT EXISTS contents (
        tenant TEXT NOT NULL,
        digest TEXT NOT NULL,
        last_seq BIGINT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (tenant, digest)
    )""",
)

# Version 11 (the idempotency look-up flat at a million executions): a look-up read two
# structures, each a level deeper as the history grew. On SQLite the table had rowids, so the
# primary key was an index beside the table and a look-up probed both B-trees; it becomes a
# table ``WITHOUT ROWID``, whose rows live in the primary key's own B-tree (rebuilt in place:
# create, copy, drop, rename, in this step's transaction, so a half-done rebuild is never seen).
# On PostgreSQL the key's index led to a heap page that the entries' traffic had pushed out of
# shared buffers; the primary key's index now carries ``execution_id`` (``INCLUDE``), so the
# look-up is an index-only scan, and autovacuum visits the table after every 10,000 new keys
# whatever its size (not after 20% more rows, the default) so that the visibility map, which
# lets the scan skip the heap, covers all but the newest keys. Those two settings exist since
# PostgreSQL 13 (``INCLUDE`` since 11): the step fails, and the store does not open, on older.
_V11: tuple[Step, ...] = (
    PerEngine(
        sqlite=(
            """CREATE TABLE idempotency_keys_v11 (
                tenant TEXT NOT NULL,
                idem_key TEXT NOT NULL,
                execution_id TEXT NOT NULL,
                PRIMARY KEY (tenant, idem_key)
            ) WITHOUT ROWID""",
            "INSERT INTO idempotency_keys_v11 (tenant, idem_key, execution_id) "
            "SELECT tenant, idem_key, execution_id FROM idempotency_keys",
            "DROP TABLE idempotency_keys",
            "ALTER TABLE idempotency_keys_v11 RENAME TO idempotency_keys",
        ),
        postgresql=(
            """CREATE UNIQUE INDEX idempotency_keys_covering
                ON idempotency_keys (tenant, idem_key) INCLUDE (execution_id)""",
            "ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey",
            "ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_pkey "
            "PRIMARY KEY USING INDEX idempotency_keys_covering",
            "ALTER TABLE idempotency_keys SET (autovacuum_vacuum_insert_scale_factor = 0, "
            "autovacuum_vacuum_insert_threshold = 10000)",
        ),
    ),
)

# Ordered steps: (version, steps). Append new steps; never edit an applied one.
MIGRATIONS: tuple[tuple[int, tuple[Step, ...]], ...] = (
    (1, _V1),
    (2, _V2),
    (3, _V3),
    (4, _V4),
    (5, _V5),
    (6, _V6),
    (7, _V7),
    (8, _V8),
    (9, _V9),
    (10, _V10),
    (11, _V11),
)
SCHEMA_VERSION = MIGRATIONS[-1][0]

VERSION_TABLE = """CREATE TABLE IF NOT EXISTS schema_version (
    version BIGINT PRIMARY KEY,
    applied_at DOUBLE PRECISION NOT NULL
)"""
