"""Fits ``max_sandboxes`` into the memory limit the server runs under.

Every process sandbox's cgroup sits below the server's own, so the limit over the server (a
container's, a pod's, a systemd slice's) bounds all of them together with the server. When
``max_sandboxes`` sandboxes at the largest memory ceiling any tenant may ask for, plus the
server's own use, exceed that limit, the kernel's OOM killer, not our `memory` limit, would end
executions (the sandboxes are its first choice, oom_score_adj 1000, but a whole-container kill
takes the server with them). So at start the server lowers ``max_sandboxes`` to what fits and
logs the arithmetic; if not even one sandbox at the ceiling fits it refuses to start, naming the
numbers and what to change.

The server's own use is what its cgroup uses at start plus `HEADROOM_BYTES` for what it grows by
under load (gRPC buffers, audit batches, the fork server's copies). The Docker and gVisor
backends' containers live in their own cgroups and are not counted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sandbox.backends.process.cgroups.own_memory import OwnMemory
from sandbox.errors import InvalidArgument
from sandbox.limits import CEILINGS
from sandbox.server.tenancy import SingleTenant
from sandbox.tenants.base import Tenancy

__all__ = ["HEADROOM_BYTES", "MemoryFit", "fit_max_sandboxes", "memory_ceiling"]

log = logging.getLogger(__name__)
MIB = 1024**2
HEADROOM_BYTES = 256 * MIB


@dataclass(frozen=True)
class MemoryFit:
    max_sandboxes: int  # what the server runs with
    requested: int  # what the configuration asked for
    ceiling_bytes: int
    own_bytes: int  # the server's own use, headroom included
    limit: OwnMemory | None


def memory_ceiling(tenancy: Tenancy) -> int:
    """The most memory one sandbox may be given: the largest tenant memory ceiling."""
    from sandbox.tenants.registry import TenantRegistry

    if isinstance(tenancy, SingleTenant):
        return tenancy.tenant.ceilings.memory_bytes
    if isinstance(tenancy, TenantRegistry):
        return max(t.ceilings.memory_bytes for t in tenancy.tenants)
    return CEILINGS.memory_bytes  # an unknown tenancy: the ceiling no tenant can pass


def fit_max_sandboxes(requested: int, ceiling_bytes: int, limit: OwnMemory | None) -> MemoryFit:
    """``requested`` or fewer sandboxes, as many as fit under ``limit``; refuses when none do."""
    if limit is None:
        return MemoryFit(requested, requested, ceiling_bytes, 0, None)
    own = (limit.usage_bytes or 0) + HEADROOM_BYTES
    room = limit.limit_bytes - own
    fits = max(room, 0) // ceiling_bytes
    arithmetic = (
        f"{limit.limit_path} allows {limit.limit_bytes // MIB} MiB; the server uses "
        f"{own // MIB} MiB ({(limit.usage_bytes or 0) // MIB} MiB now plus "
        f"{HEADROOM_BYTES // MIB} MiB headroom), and one sandbox may take "
        f"{ceiling_bytes // MIB} MiB (the largest tenant memory ceiling)"
    )
    if fits < 1:
        raise InvalidArgument(
            f"max_sandboxes: not one sandbox fits in the server's memory limit: {arithmetic}; "
            "raise the limit or lower the tenants' memory ceiling (ceilings.memory)"
        )
    if fits < requested:
        log.warning(
            "max_sandboxes: lowered from %d to %d so that every sandbox fits: %s",
            requested,
            fits,
            arithmetic,
        )
        return MemoryFit(fits, requested, ceiling_bytes, own, limit)
    return MemoryFit(requested, requested, ceiling_bytes, own, limit)
