"""What a tenant may ask for: effective limits under its ceilings, backends and tool modes.

The server calls these once per request, after `Tenancy.authenticate` and before `admit`, so a
refused request never takes a slot. Effective limits go through `sandbox.limits.apply_ceilings`
with the tenant's defaults, ceilings and policy: ``clamp`` lowers a value and reports it as an
adjustment in the result, ``refuse`` raises `InvalidLimits` naming the limit and the ceiling.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sandbox.errors import NotFound, PermissionDenied
from sandbox.limits import LimitAdjustment, Limits, ResolvedLimits, apply_ceilings
from sandbox.tenants.base import Tenant

__all__ = ["check_backend", "check_runtime", "check_tool_modes", "effective_limits"]


def effective_limits(
    tenant: Tenant, requested: Limits
) -> tuple[ResolvedLimits, list[LimitAdjustment]]:
    """The request's limits (or the tenant's defaults) capped by the tenant's ceilings
    (`apply_ceilings` remembers the answer per distinct request)."""
    return apply_ceilings(requested, tenant.defaults, tenant.ceilings, tenant.ceiling_policy)


def check_backend(tenant: Tenant, backend: str) -> None:
    if backend not in tenant.backends:
        allowed = ", ".join(sorted(tenant.backends))
        raise PermissionDenied(
            f"backend: tenant {tenant.id!r} may not use {backend!r} (allowed: {allowed})"
        )


def check_runtime(
    tenant: Tenant, runtime: str | None, exists: Callable[[str], bool] | None = None
) -> None:
    """Whether the tenant may name ``runtime``, checked in this order: the standard library (no
    runtime, or "default") is always allowed; a bad name is `InvalidArgument` naming the rule,
    before anything else; for a tenant with a ``runtimes`` list, one that is not built
    (``exists`` says) is `NotFound` and one not on its list `PermissionDenied`. Both name only
    the tenant's own runtimes, never the others built on the server nor where they are. A
    tenant without a list (the single tenant) may name any: the backend says if it is built."""
    from sandbox.runtimes import DEFAULT_RUNTIME, validate_name

    if not runtime or runtime == DEFAULT_RUNTIME:
        return
    validate_name(runtime)
    if tenant.runtimes is None:
        return
    allowed = ", ".join(sorted(tenant.runtimes)) or "only the default"
    if exists is not None and not exists(runtime):
        raise NotFound(
            f"runtime: no runtime named {runtime!r} on this server (tenant {tenant.id!r} may "
            f"use: {allowed})"
        )
    if runtime not in tenant.runtimes:
        raise PermissionDenied(
            f"runtime: tenant {tenant.id!r} may not use {runtime!r} (allowed: {allowed})"
        )


def check_tool_modes(tenant: Tenant, modes: Iterable[tuple[str, str]]) -> None:
    """``modes`` are (tool name, handler mode) pairs, in manifest order."""
    for index, (tool, mode) in enumerate(modes):
        if mode not in tenant.tool_modes:
            allowed = ", ".join(sorted(tenant.tool_modes))
            raise PermissionDenied(
                f"manifest: tools[{index}] {tool!r}: tenant {tenant.id!r} may not use "
                f"{mode!r}-mode tools (allowed: {allowed})"
            )
