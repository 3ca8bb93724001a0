"""Tenants: who is calling, what they may use, and how much of it.

`load_tenancy(path)` reads a tenants file (`sandbox.tenants.config`) into a `TenantRegistry`,
the `Tenancy` that authenticates API keys and admits executions under per-tenant quotas;
`sandbox.tenants.policy` computes effective limits and checks backends and tool modes.
"""

from sandbox.tenants.base import Tenancy, Tenant
from sandbox.tenants.config import TenantConfigError, TenantsFile, load_tenants, parse_tenants
from sandbox.tenants.keys import hash_key, new_key
from sandbox.tenants.policy import check_backend, check_tool_modes, effective_limits
from sandbox.tenants.registry import TenantRegistry, load_tenancy

__all__ = [
    "Tenancy",
    "Tenant",
    "TenantConfigError",
    "TenantRegistry",
    "TenantsFile",
    "check_backend",
    "check_tool_modes",
    "effective_limits",
    "hash_key",
    "load_tenancy",
    "load_tenants",
    "new_key",
    "parse_tenants",
]
