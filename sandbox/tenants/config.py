"""The tenants file (TOML): who may call, with which keys, limits, quotas and policies.

    [[tenant]]
    id = "acme"                       # [A-Za-z0-9_.-], unique
    keys = ["sha256:9f86d0..."]       # hashes only: `ptc tenants hash-key`
    max_concurrent = 4                # executions running at once
    queue = 16                        # more may wait, first come first served; 0 = refuse
    rate_per_minute = 120             # token bucket refilled at rate/60 per second ...
    rate_burst = 20                   # ... holding at most this many (default: rate_per_minute)
    backends = ["process"]            # subset of process, docker, gvisor
    tool_modes = ["echo", "mock"]     # subset of echo, mock, host, client
    script_policy = "restricted"      # default when a request does not say: none | restricted
    ceiling_policy = "clamp"          # a request above a ceiling: clamp | refuse
    audit_retention_days = 90         # 0 keeps records forever
    labels = { team = "search" }
    runtimes = ["numpy"]              # runtimes it may name (`ptc runtime list`); unset: stdlib
    sessions = "allowed"              # CreateSession: allowed | denied
    max_sessions = 4                  # sessions open at once (0: none)
    session_idle_timeout_s = 600      # ceiling (and default) of a session's idle timeout
    session_max_lifetime_s = 3600     # ceiling (and default) of a session's lifetime
    session_rebuild_max_cells = 200   # a session rebuilt on another server: most cells replayed
    session_rebuild_max_cpu_s = 60    # ... and most CPU seconds spent replaying them

    [tenant.defaults]                 # limits a request inherits; names as in sandbox.limits
    wall_time = 5                     # seconds
    [tenant.ceilings]                 # no request may exceed these
    wall_time = 60
    memory = "1g"                     # bytes; k/m/g suffixes allowed

Unset defaults are the server's, lowered to the tenant's ceilings; unset ceilings are the
server's maximum (`sandbox.limits.CEILINGS`), which no tenant ceiling may exceed. Every error
is a `TenantConfigError` naming the file, the tenant and the key path.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from sandbox.backend_names import BACKEND_NAMES
from sandbox.errors import InvalidArgument, PtcError
from sandbox.limits import CEILINGS, DEFAULTS, LIMIT_SPECS, SPEC_BY_NAME, ResolvedLimits
from sandbox.tenants.base import Tenant
from sandbox.tenants.keys import KeyHash

__all__ = ["TenantConfig", "TenantConfigError", "TenantsFile", "load_tenants", "parse_tenants"]

BACKENDS = frozenset(BACKEND_NAMES)
TOOL_MODES = frozenset({"echo", "mock", "host", "client"})
_ID = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_FIELDS = frozenset(
    {
        "id",
        "keys",
        "max_concurrent",
        "queue",
        "rate_per_minute",
        "rate_burst",
        "backends",
        "tool_modes",
        "script_policy",
        "ceiling_policy",
        "audit_retention_days",
        "labels",
        "runtimes",
        "defaults",
        "ceilings",
        "sessions",
        "max_sessions",
        "session_idle_timeout_s",
        "session_max_lifetime_s",
        "session_rebuild_max_cells",
        "session_rebuild_max_cpu_s",
    }
)


class TenantConfigError(InvalidArgument):
    """A bad tenants file; the message names the file, the tenant and the key path."""

    def __init__(self, origin: str, tenant: str | None, key: str, problem: str) -> None:
        who = f"tenant {tenant!r}" if tenant is not None else "top level"
        super().__init__(f"{origin}: {who}: {key}: {problem}")
        self.tenant = tenant
        self.key = key


@dataclass(frozen=True)
class TenantConfig:
    """One tenant as configured: the `Tenant` the server sees, plus what only tenancy needs."""

    tenant: Tenant
    keys: tuple[KeyHash, ...]
    rate_burst: int


@dataclass(frozen=True)
class TenantsFile:
    origin: str
    tenants: tuple[TenantConfig, ...]

    def tenant(self, tenant_id: str) -> Tenant | None:
        for config in self.tenants:
            if config.tenant.id == tenant_id:
                return config.tenant
        return None


class _Reader:
    """Reads one tenant's table, raising errors that carry the tenant and key path."""

    def __init__(self, origin: str, tenant: str | None, table: Mapping[str, Any]) -> None:
        self.origin, self.tenant, self.table = origin, tenant, table

    def fail(self, key: str, problem: str) -> TenantConfigError:
        return TenantConfigError(self.origin, self.tenant, key, problem)

    def integer(self, key: str, default: int, minimum: int) -> int:
        value = self.table.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(key, f"must be an integer >= {minimum}, got {value!r}")
        return value

    def choice(self, key: str, default: str, allowed: Sequence[str]) -> str:
        value = self.table.get(key, default)
        if value not in allowed:
            raise self.fail(key, f"must be one of {', '.join(allowed)}, got {value!r}")
        return str(value)

    def subset(self, key: str, default: frozenset[str], allowed: frozenset[str]) -> frozenset[str]:
        value = self.table.get(key, sorted(default))
        if not isinstance(value, list) or not value:
            raise self.fail(key, f"must be a non-empty list of {', '.join(sorted(allowed))}")
        for i, item in enumerate(value):
            if item not in allowed:
                raise self.fail(
                    f"{key}[{i}]", f"{item!r} is not one of {', '.join(sorted(allowed))}"
                )
        return frozenset(value)

    def limits(self, key: str) -> dict[str, int]:
        """A limits table in human units, as canonical ``{field: value}``."""
        table = self.table.get(key, {})
        if not isinstance(table, dict):
            raise self.fail(key, "must be a table of limit = value")
        fields: dict[str, int] = {}
        for name, value in table.items():
            spec = SPEC_BY_NAME.get(name)
            if spec is None:
                known = ", ".join(s.name for s in LIMIT_SPECS)
                raise self.fail(f"{key}.{name}", f"unknown limit (known: {known})")
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                raise self.fail(f"{key}.{name}", f"must be a number ({spec.unit}), got {value!r}")
            try:
                fields[spec.field] = spec.from_human(str(value))
            except PtcError as exc:
                raise self.fail(f"{key}.{name}", exc.message) from None
        return fields


def _tenant(origin: str, index: int, table: Any) -> TenantConfig:
    if not isinstance(table, dict):
        raise TenantConfigError(origin, None, f"tenant[{index}]", "must be a table")
    raw_id = table.get("id")
    if not isinstance(raw_id, str) or not _ID.fullmatch(raw_id):
        raise TenantConfigError(
            origin, None, f"tenant[{index}].id", f"must be 1-64 of [A-Za-z0-9_.-], got {raw_id!r}"
        )
    read = _Reader(origin, raw_id, table)
    for key in table:
        if key not in _FIELDS:
            raise read.fail(key, f"unknown key (known: {', '.join(sorted(_FIELDS))})")
    keys = table.get("keys")
    if not isinstance(keys, list) or not keys:
        raise read.fail("keys", "must be a non-empty list of key hashes (`ptc tenants hash-key`)")
    parsed: list[KeyHash] = []
    for i, text in enumerate(keys):
        try:
            parsed.append(KeyHash(text if isinstance(text, str) else repr(text)))
        except ValueError as exc:
            raise read.fail(f"keys[{i}]", str(exc)) from None
    ceilings = _ceilings(read)
    defaults = _defaults(read, ceilings)
    labels = table.get("labels", {})
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise read.fail("labels", "must be a table of string values")
    rate = read.integer("rate_per_minute", 600, 1)
    runtimes = _runtimes(read)
    tenant = Tenant(
        id=raw_id,
        defaults=defaults,
        ceilings=ceilings,
        ceiling_policy=cast(
            Literal["clamp", "refuse"], read.choice("ceiling_policy", "clamp", ("clamp", "refuse"))
        ),
        max_concurrent=read.integer("max_concurrent", 8, 1),
        queue=read.integer("queue", 32, 0),
        rate_per_minute=rate,
        backends=read.subset("backends", BACKENDS, BACKENDS),
        tool_modes=read.subset("tool_modes", TOOL_MODES, TOOL_MODES),
        script_policy=cast(
            Literal["none", "restricted"],
            read.choice("script_policy", "none", ("none", "restricted")),
        ),
        audit_retention_days=read.integer("audit_retention_days", 30, 0),
        labels=dict(labels),
        runtimes=runtimes,
        sessions_allowed=read.choice("sessions", "allowed", ("allowed", "denied")) == "allowed",
        max_sessions=read.integer("max_sessions", 4, 0),
        session_idle_timeout_s=read.integer("session_idle_timeout_s", 600, 1),
        session_max_lifetime_s=read.integer("session_max_lifetime_s", 3600, 1),
        session_rebuild_max_cells=read.integer("session_rebuild_max_cells", 200, 0),
        session_rebuild_max_cpu_s=read.integer("session_rebuild_max_cpu_s", 60, 0),
    )
    return TenantConfig(tenant, tuple(parsed), read.integer("rate_burst", rate, 1))


def _runtimes(read: _Reader) -> frozenset[str]:
    """The runtimes a tenant may name; unset: none beyond the standard library."""
    from sandbox.runtimes import validate_name

    value = read.table.get("runtimes", [])
    if not isinstance(value, list):
        raise read.fail("runtimes", "must be a list of runtime names")
    for i, item in enumerate(value):
        try:
            validate_name(item)
        except PtcError as exc:
            raise read.fail(f"runtimes[{i}]", exc.message) from None
    return frozenset(value)


def _ceilings(read: _Reader) -> ResolvedLimits:
    fields = read.limits("ceilings")
    for field, value in fields.items():
        spec = next(s for s in LIMIT_SPECS if s.field == field)
        maximum = CEILINGS.value(spec.name)
        if value > maximum:
            raise read.fail(
                f"ceilings.{spec.name}",
                f"{spec.describe(value)} is above the server's maximum of {spec.describe(maximum)}",
            )
    return dataclasses.replace(CEILINGS, **fields)


def _defaults(read: _Reader, ceilings: ResolvedLimits) -> ResolvedLimits:
    fields = read.limits("defaults")
    values: dict[str, int] = {}
    for spec in LIMIT_SPECS:
        ceiling = ceilings.value(spec.name)
        if spec.field in fields:
            if fields[spec.field] > ceiling:
                raise read.fail(
                    f"defaults.{spec.name}",
                    f"{spec.describe(fields[spec.field])} is above the tenant's "
                    f"ceiling of {spec.describe(ceiling)}",
                )
            values[spec.field] = fields[spec.field]
        else:
            values[spec.field] = min(DEFAULTS.value(spec.name), ceiling)
    return ResolvedLimits(**values)


def parse_tenants(text: str, origin: str = "tenants file") -> TenantsFile:
    """Parses and validates a tenants file's text."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TenantConfigError(origin, None, "(syntax)", str(exc)) from None
    for key in data:
        if key != "tenant":
            raise TenantConfigError(origin, None, key, "unknown key (expected [[tenant]] tables)")
    tables = data.get("tenant", [])
    if not isinstance(tables, list) or not tables:
        raise TenantConfigError(origin, None, "tenant", "expected at least one [[tenant]] table")
    tenants = [_tenant(origin, i, table) for i, table in enumerate(tables)]
    seen: dict[str, int] = {}
    owners: dict[str, str] = {}
    for i, config in enumerate(tenants):
        tid = config.tenant.id
        if tid in seen:
            raise TenantConfigError(
                origin, tid, f"tenant[{i}].id", f"duplicates the id of tenant[{seen[tid]}]"
            )
        seen[tid] = i
        for k, key_hash in enumerate(config.keys):
            if key_hash.text in owners:
                raise TenantConfigError(
                    origin, tid, f"keys[{k}]", f"is also a key of tenant {owners[key_hash.text]!r}"
                )
            owners[key_hash.text] = tid
    return TenantsFile(origin, tuple(tenants))


def load_tenants(path: str | Path) -> TenantsFile:
    """Reads and validates the tenants file at ``path``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TenantConfigError(str(path), None, "(file)", f"cannot read: {exc}") from exc
    return parse_tenants(text, origin=str(path))
