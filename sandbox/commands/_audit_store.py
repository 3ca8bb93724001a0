"""Opening the audit store an operator command names with ``--db`` (`ptc audit` and its checkpoint
parts in `_audit_checkpoints`).

These commands read a store that already exists: a missing SQLite file is refused naming it,
rather than created empty (which would make ``verify`` pass on nothing).
"""

from __future__ import annotations

import argparse
import os

from sandbox.audit import SqlAuditStore, is_postgres_url, open_store
from sandbox.errors import InvalidArgument

__all__ = ["open_named_store"]


def open_named_store(args: argparse.Namespace) -> SqlAuditStore:
    """The store at ``args.db`` (a SQLite path or ``postgresql://`` URL); `InvalidArgument` when
    none is named or the SQLite file does not exist."""
    target = args.db
    if not target:
        raise InvalidArgument("no audit store: pass --db PATH|URL or set PTC_AUDIT_DB")
    if not is_postgres_url(target) and not os.path.exists(target.removeprefix("sqlite://")):
        raise InvalidArgument(f"no audit store at {target}")
    return open_store(target)
