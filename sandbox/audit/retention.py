"""Retention: prune each tenant's records older than its ``audit_retention_days``.

Pruning goes through `SqlAuditStore.prune`, which removes only a finished prefix of the chain
and leaves a checkpoint plus a ``pruned`` entry, so the chain still verifies afterwards. The
server may call `apply_retention` at start-up and then daily; ``ptc audit prune`` calls it on
demand.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from sandbox.audit._sqlcore import SqlAuditStore
from sandbox.tenants.base import Tenant

__all__ = ["apply_retention"]

DAY_S = 86400.0


def apply_retention(
    store: SqlAuditStore, tenants: Iterable[Tenant], now: float | None = None
) -> dict[str, int]:
    """Prunes every tenant with a retention (0 keeps forever); returns records pruned per id."""
    moment = time.time() if now is None else now
    return {
        tenant.id: store.prune(tenant.id, moment - tenant.audit_retention_days * DAY_S)
        for tenant in tenants
        if tenant.audit_retention_days > 0
    }
