"""The tenants file: a valid file loads, every bad one names the tenant and the key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.errors import InvalidLimits
from sandbox.limits import CEILINGS, DEFAULTS, Limits
from sandbox.tenants import effective_limits, hash_key, parse_tenants
from sandbox.tenants.config import TenantConfigError
from tests.ptc_cli import run_ptc as ptc

KEY_A = "ptc_key_for_acme"
KEY_B = "ptc_key_for_globex"

GOOD = f"""
[[tenant]]
id = "acme"
keys = ["{hash_key(KEY_A)}"]
max_concurrent = 3
queue = 5
rate_per_minute = 120
rate_burst = 10
backends = ["process"]
tool_modes = ["echo", "mock"]
script_policy = "restricted"
ceiling_policy = "refuse"
audit_retention_days = 90
labels = {{ team = "search" }}

[tenant.defaults]
wall_time = 5
memory = "128m"

[tenant.ceilings]
wall_time = 30
memory = 536870912

[[tenant]]
id = "globex"
keys = ["{hash_key(KEY_B, "scrypt")}"]

[tenant.ceilings]
wall_time = 2.5
"""


def test_a_valid_file_loads() -> None:
    loaded = parse_tenants(GOOD)
    acme = loaded.tenant("acme")
    assert acme is not None
    assert acme.max_concurrent == 3 and acme.queue == 5 and acme.rate_per_minute == 120
    assert acme.backends == frozenset({"process"})
    assert acme.tool_modes == frozenset({"echo", "mock"})
    assert acme.script_policy == "restricted" and acme.ceiling_policy == "refuse"
    assert acme.audit_retention_days == 90 and acme.labels == {"team": "search"}
    assert acme.defaults.wall_time_ms == 5000 and acme.defaults.memory_bytes == 128 * 1024**2
    assert acme.ceilings.wall_time_ms == 30_000 and acme.ceilings.memory_bytes == 512 * 1024**2
    assert acme.ceilings.processes == CEILINGS.processes
    assert loaded.tenants[0].rate_burst == 10
    globex = loaded.tenant("globex")
    assert globex is not None
    assert globex.ceilings.wall_time_ms == 2500
    # An unset default above the tenant's ceiling is lowered to it.
    assert globex.defaults.wall_time_ms == 2500
    assert globex.defaults.memory_bytes == DEFAULTS.memory_bytes
    assert globex.ceiling_policy == "clamp" and globex.max_concurrent == 8


def test_ceilings_clamp_or_refuse_per_tenant_policy() -> None:
    loaded = parse_tenants(GOOD)
    acme, globex = loaded.tenant("acme"), loaded.tenant("globex")
    assert acme is not None and globex is not None

    limits, adjustments = effective_limits(globex, Limits(wall_time_ms=60_000))
    assert limits.wall_time_ms == 2500
    assert [(a.limit, a.requested, a.applied, a.action) for a in adjustments] == [
        ("wall_time", 60.0, 2.5, "clamped")
    ]
    limits, adjustments = effective_limits(globex, Limits(wall_time_ms=2000))
    assert limits.wall_time_ms == 2000 and adjustments == []

    with pytest.raises(
        InvalidLimits, match=r"limits\.wall_time: 60 s is above the ceiling of 30 s"
    ):
        effective_limits(acme, Limits(wall_time_ms=60_000))
    limits, adjustments = effective_limits(acme, Limits(wall_time_ms=30_000))
    assert limits.wall_time_ms == 30_000 and adjustments == []
    limits, _ = effective_limits(acme, Limits())
    assert limits.wall_time_ms == 5000 and limits.memory_bytes == 128 * 1024**2


SHA = "sha256:" + "a" * 64
BAD = [
    ("syntax", "[[tenant]\n", None, "(syntax)"),
    ("no-tenants", "", None, "tenant"),
    ("unknown-top", f'[server]\nx = 1\n[[tenant]]\nid = "a"\nkeys = ["{SHA}"]\n', None, "server"),
    ("bad-id", f'[[tenant]]\nid = "a b"\nkeys = ["{SHA}"]\n', None, "tenant[0].id"),
    ("no-keys", '[[tenant]]\nid = "acme"\n', "acme", "keys"),
    ("plain-key", '[[tenant]]\nid = "acme"\nkeys = ["hunter2"]\n', "acme", "keys[0]"),
    (
        "unknown-key",
        f'[[tenant]]\nid = "acme"\nkeys = ["{SHA}"]\nmax_conc = 1\n',
        "acme",
        "max_conc",
    ),
    (
        "bad-concurrency",
        f'[[tenant]]\nid = "acme"\nkeys = ["{SHA}"]\nmax_concurrent = 0\n',
        "acme",
        "max_concurrent",
    ),
    ("bad-queue", f'[[tenant]]\nid = "acme"\nkeys = ["{SHA}"]\nqueue = -1\n', "acme", "queue"),
    (
        "bad-rate",
        f'[[tenant]]\nid = "acme"\nkeys = ["{SHA}"]\nrate_per_minute = "fast"\n',
        "acme",
        "rate_per_minute",
    ),
    (
        "bad-backend",
        f'[[tenant]]\nid = "acme"\nkeys = ["{SHA}"]\nbackends = ["vm"]\n',
        "acme",
        "backends[0]",
    ),
    (
        "bad-mode",
        f'[[tenant]]\nid = "acme"\nkeys = ["{SHA}"]\ntool_modes = ["echo", "shell"]\n',
        "acme",
        "tool_modes[1]",
    ),
    (
        "bad-policy",
        f'[[tenant]]\nid = "acme"\nkeys = ["{SHA}"]\nceiling_policy = "ignore"\n',
        "acme",
        "ceiling_policy",
    ),
    (
        "bad-script-policy",
        f'[[tenant]]\nid = "acme"\nkeys = ["{SHA}"]\nscript_policy = "strict"\n',
        "acme",
        "script_policy",
    ),
    (
        "unknown-limit",
        f'[[tenant]]\nid = "acme"\nkeys = ["{SHA}"]\n[tenant.ceilings]\nwalltime = 1\n',
        "acme",
        "ceilings.walltime",
    ),
    (
        "bad-limit",
        f'[[tenant]]\nid = "acme"\nkeys = ["{SHA}"]\n[tenant.ceilings]\nmemory = "lots"\n',
        "acme",
        "ceilings.memory",
    ),
    (
        "above-max",
        f'[[tenant]]\nid = "acme"\nkeys = ["{SHA}"]\n[tenant.ceilings]\nwall_time = 100000\n',
        "acme",
        "ceilings.wall_time",
    ),
    (
        "default-above-ceiling",
        f'[[tenant]]\nid = "acme"\nkeys = ["{SHA}"]\n[tenant.defaults]\nwall_time = 20\n[tenant.ceilings]\nwall_time = 10\n',
        "acme",
        "defaults.wall_time",
    ),
    (
        "dup-id",
        f'[[tenant]]\nid = "acme"\nkeys = ["{SHA}"]\n[[tenant]]\nid = "acme"\nkeys = ["sha256:{"b" * 64}"]\n',
        "acme",
        "tenant[1].id",
    ),
    (
        "shared-key",
        f'[[tenant]]\nid = "acme"\nkeys = ["{SHA}"]\n[[tenant]]\nid = "globex"\nkeys = ["{SHA}"]\n',
        "globex",
        "keys[0]",
    ),
    (
        "bad-labels",
        f'[[tenant]]\nid = "acme"\nkeys = ["{SHA}"]\nlabels = {{ a = 1 }}\n',
        "acme",
        "labels",
    ),
]


@pytest.mark.parametrize(("text", "tenant", "key"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_files_name_the_tenant_and_key(text: str, tenant: str | None, key: str) -> None:
    with pytest.raises(TenantConfigError) as caught:
        parse_tenants(text, origin="tenants.toml")
    error = caught.value
    assert error.tenant == tenant
    assert error.key == key
    assert error.message.startswith("tenants.toml: ")
    if tenant is not None:
        assert f"tenant {tenant!r}" in error.message
    assert f": {key}: " in error.message


def test_cli_check_and_hash_key(tmp_path: Path) -> None:
    good = tmp_path / "tenants.toml"
    good.write_text(GOOD)
    checked = ptc("tenants", "check", str(good))
    assert checked.returncode == 0, checked.stderr
    assert "acme: 1 key(s)" in checked.stdout and "ok: 2 tenant(s)" in checked.stdout

    bad = tmp_path / "bad.toml"
    bad.write_text(dict((b[0], b[1]) for b in BAD)["unknown-limit"])
    refused = ptc("tenants", "check", str(bad))
    assert refused.returncode == 2
    assert "tenant 'acme'" in refused.stderr and "ceilings.walltime" in refused.stderr
    missing = ptc("tenants", "check", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr

    hashed = ptc("tenants", "hash-key", KEY_A)
    assert hashed.stdout.strip() == hash_key(KEY_A)
    from_stdin = ptc("tenants", "hash-key", "-", stdin=KEY_A + "\n")
    assert from_stdin.stdout.strip() == hash_key(KEY_A)
    fresh = ptc("tenants", "hash-key").stdout.split()
    assert len(fresh) == 2 and fresh[0].startswith("ptc_") and fresh[1] == hash_key(fresh[0])
    scrypt = ptc("tenants", "hash-key", "--scrypt", KEY_A).stdout.strip()
    assert scrypt.startswith("scrypt:") and scrypt != hash_key(KEY_A, "scrypt")
