"""The audit store: every admitted execution and every tool call it made, append-only.

`open_store` picks the engine from its argument: a ``postgresql://`` (or ``postgres://``) URL
opens the shared PostgreSQL store, anything else (a path, or ``sqlite:///path``) the SQLite file.
`result_to_json` is a result in the form its record keeps (each stream cut to
`OUTPUT_CAP_BYTES`), which a replay is compared in.
"""

from __future__ import annotations

import os

from sandbox.audit._codec import OUTPUT_CAP_BYTES, result_to_json
from sandbox.audit._sqlcore import SqlAuditStore
from sandbox.audit.base import (
    Admission,
    AuditQuery,
    AuditRecord,
    AuditStore,
    KeyTaken,
    VerifyReport,
)

__all__ = [
    "OUTPUT_CAP_BYTES",
    "Admission",
    "AuditQuery",
    "AuditRecord",
    "AuditStore",
    "KeyTaken",
    "SqlAuditStore",
    "VerifyReport",
    "is_postgres_url",
    "open_store",
    "result_to_json",
]


def is_postgres_url(target: str) -> bool:
    return target.startswith(("postgresql://", "postgres://"))


def open_store(target: str | os.PathLike[str], *, instance: str | None = None) -> SqlAuditStore:
    """Opens (creating and migrating as needed) the store at a path or database URL."""
    text = os.fspath(target)
    if is_postgres_url(text):
        from sandbox.audit.postgres import PostgresAuditStore

        return PostgresAuditStore(text, instance=instance)
    from sandbox.audit.sqlite import SQLiteAuditStore

    path = text.removeprefix("sqlite://") if text.startswith("sqlite:///") else text
    return SQLiteAuditStore(path, instance=instance)
