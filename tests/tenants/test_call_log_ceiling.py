"""`call_log_bytes` is a limit like the others end to end: command line, tenants file (default
and ceiling, bounded by the server's maximum), proto `Limits`, clamping."""

from __future__ import annotations

import pytest

from sandbox.codec.limits import limits_from_proto, limits_to_proto
from sandbox.limits import CEILINGS, DEFAULTS, Limits, apply_ceilings, parse_limit_args
from sandbox.tenants.config import TenantConfigError, parse_tenants

MiB = 1 << 20
KEY = "sha256:" + "0" * 64
TENANT = """
[[tenant]]
id = "acme"
keys = ["{key}"]
[tenant.defaults]
call_log_bytes = "{default}"
[tenant.ceilings]
call_log_bytes = "{ceiling}"
"""


def test_command_line_proto_and_defaults() -> None:
    limits = parse_limit_args(["call_log_bytes=2m"])
    assert limits == Limits(call_log_bytes=2 * MiB)
    assert limits_from_proto(limits_to_proto(limits)) == limits
    assert (DEFAULTS.call_log_bytes, CEILINGS.call_log_bytes) == (8 * MiB, 64 * MiB)


def test_tenant_default_and_ceiling() -> None:
    tenant = parse_tenants(TENANT.format(key=KEY, default="1m", ceiling="4m")).tenant("acme")
    assert tenant is not None
    assert (tenant.defaults.call_log_bytes, tenant.ceilings.call_log_bytes) == (MiB, 4 * MiB)
    effective, adjustments = apply_ceilings(
        Limits(call_log_bytes=16 * MiB), tenant.defaults, tenant.ceilings
    )
    assert effective.call_log_bytes == 4 * MiB
    assert [(a.limit, a.requested, a.applied) for a in adjustments] == [
        ("call_log_bytes", 16 * MiB, 4 * MiB)
    ]


def test_tenant_ceiling_above_the_servers_maximum_is_refused() -> None:
    with pytest.raises(TenantConfigError) as caught:
        parse_tenants(TENANT.format(key=KEY, default="1m", ceiling="65m"))
    assert caught.value.message == (
        "tenants file: tenant 'acme': ceilings.call_log_bytes: 68157440 bytes is above the "
        "server's maximum of 67108864 bytes"
    )
