"""The server's configuration: where it listens, its pool, its host handlers, its grace period.

Read from a TOML file (`ptc serve --config server.toml`) and overridden by command-line flags.
Host handlers are named here, by the operator, as ``tool name = "module:function"``; a manifest
can never name code for the host to import. Example::

    listen = "127.0.0.1:50051"
    pool_size = 4
    max_sandboxes = 64                     # process sandboxes alive at once (more wait)
    allow_degraded = false
    shutdown_grace_s = 10
    audit_db = "/var/lib/ptc/audit.db"     # or postgresql://...; unset: in memory
    tenants = "/etc/ptc/tenants.toml"      # unset: one tenant, loopback only
    instance_id = "ptc-1"                  # unique per server sharing one audit store
    docker = true                          # also offer the Docker backend
    metrics_listen = "127.0.0.1:9464"      # Prometheus metrics at /metrics; unset: none
    gvisor = true                          # ... and it under gVisor (runsc), as "gvisor"
    runtimes_dir = "/var/lib/ptc/runtimes" # runtimes requests may name (`ptc runtime build`)
    global_quotas = true                   # with postgresql://: quotas hold across the fleet
    quota_lease_ttl_s = 15                 # a crashed server's quota slots return after this
    member_lease_ttl_s = 15                # a server silent this long is dead: its records are
                                           # marked `interrupted` by a survivor
    checkpoint_interval_s = 300            # sign audit checkpoints this often (default 300)
    checkpoint_key = "/etc/ptc/checkpoint.key"   # Ed25519 PEM; unset: $PTC_CHECKPOINT_KEY
    checkpoint_dir = "/var/lib/ptc/checkpoints"  # latest per tenant + checkpoints.jsonl
    tls_cert = "/etc/ptc/tls/server.crt"   # serve TLS with this PEM chain and key (both or
    tls_key = "/etc/ptc/tls/server.key"    # neither; re-read when they change on disk)
    tls_client_ca = "/etc/ptc/tls/clients-ca.crt"  # mTLS: require client certs from these CAs
    fleet_ca = "/etc/ptc/tls/fleet-ca.crt" # the CA of the fleet's servers' client certificates
    fleet_cert = "/etc/ptc/tls/fleet.crt"  # this server's own, issued by fleet_ca, and its key:
    fleet_key = "/etc/ptc/tls/fleet.key"   # presented when it carries a call to another server
    fleet_peer_ca = "/etc/ptc/tls/ca.crt"  # trust the other servers' TLS certificates (unset:
                                           # the system's CAs)
    advertise = "ptc-1.internal:50051"     # where the other servers reach this one (unset: the
                                           # listen address, or the host name for 0.0.0.0)
    keepalive_interval_s = 60              # ping a client after this long without data ...
    keepalive_timeout_s = 20               # ... and cancel its calls when it does not answer

    [host_handlers]
    get_weather = "myco.tools:get_weather"

    [host_handler_limits]
    timeout_s = 5
    concurrency = 16
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sandbox.errors import InvalidArgument
from sandbox.keepalive import MIN_INTERVAL_S

__all__ = ["ServerConfig", "load_config"]


@dataclass(frozen=True)
class ServerConfig:
    listen: str = "127.0.0.1:50051"
    pool_size: int = 4
    # Process sandboxes alive at once, idle and running (more executions wait for one to end):
    # with the tenants' memory ceiling it bounds what all sandboxes together may hold.
    max_sandboxes: int = 64
    allow_degraded: bool = False
    # In-flight executions get this long to finish at shutdown; the rest are cancelled.
    shutdown_grace_s: float = 10.0
    host_handlers: Mapping[str, str] = field(default_factory=dict)
    host_handler_timeout_s: float = 10.0
    host_handler_concurrency: int = 16
    max_message_bytes: int = 32 * 1024 * 1024
    # Audit store: a SQLite path or a postgresql:// URL; None keeps records in memory only.
    audit_db: str | None = None
    # Tenants file (TOML); None runs the single-tenant default, which listens on loopback only.
    tenants: str | None = None
    instance_id: str | None = None
    docker: bool = False
    # Prometheus metrics at http://HOST:PORT/metrics (e.g. 127.0.0.1:9464); None: no metrics.
    metrics_listen: str | None = None
    # Where runtimes are (`ptc runtime build`); None: `sandbox.runtimes.default_runtimes_dir()`.
    runtimes_dir: str | None = None
    # Also offer backend "gvisor": the Docker backend with the OCI runtime runsc.
    gvisor: bool = False
    # With a PostgreSQL audit store: enforce tenants' quotas across every server sharing it
    # (`sandbox.tenants.global_quota`); a crashed server's slots return after the lease expiry.
    global_quotas: bool = True
    quota_lease_ttl_s: float = 15.0
    # Every server sharing the audit store renews a lease every third of this; one whose lease
    # expired is dead, and a survivor marks its running records `interrupted` (`fleet.Membership`).
    member_lease_ttl_s: float = 15.0
    # Signed audit checkpoints (`sandbox.audit.publisher`): on when an interval or a directory
    # is set; the key is a PEM file, or else $PTC_CHECKPOINT_KEY.
    checkpoint_interval_s: float | None = None
    checkpoint_key: str | None = None
    checkpoint_dir: str | None = None
    # TLS (`sandbox.server.tls`): PEM files, picked up again when they change; None: plaintext.
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    fleet_ca: str | None = None
    # Carrying session calls to the server holding them (`sandbox.server.forwarding`): this
    # server's fleet client certificate and key, the CAs of the other servers' TLS certificates,
    # and the address they reach this one at.
    fleet_cert: str | None = None
    fleet_key: str | None = None
    fleet_peer_ca: str | None = None
    advertise: str | None = None
    # HTTP/2 pings to clients (`sandbox.keepalive.server_options`): a client that vanished
    # without closing its connection (its host frozen or gone) has its calls cancelled, its
    # executions killed and recorded, once a ping sent after this long without data goes
    # unanswered for keepalive_timeout_s.
    keepalive_interval_s: float = 60.0
    keepalive_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        # The interval's floor is the clients': the servers ping each other as clients do.
        for name, what, least in (
            ("keepalive_interval_s", f"at least {MIN_INTERVAL_S:g} s", MIN_INTERVAL_S),
            ("keepalive_timeout_s", "a positive number of seconds", 0.0),
        ):
            value = getattr(self, name)
            number = isinstance(value, int | float) and math.isfinite(value)
            if not (number and value > 0 and value >= least):
                raise InvalidArgument(f"{name}: {what}, got {value!r}")

    def with_overrides(self, **changes: Any) -> ServerConfig:
        """This config with every non-None keyword applied."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def load_config(path: str | Path) -> ServerConfig:
    """Parses a TOML config file, naming the key at fault on any error."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InvalidArgument(f"config {path}: {exc}") from exc
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key == "host_handlers":
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise InvalidArgument(f"config {path}: host_handlers: tool = 'module:function'")
            values["host_handlers"] = dict(value)
        elif key == "host_handler_limits":
            values.update(_handler_limits(path, value))
        elif key in (
            "listen",
            "audit_db",
            "tenants",
            "instance_id",
            "metrics_listen",
            "runtimes_dir",
            "tls_cert",
            "tls_key",
            "tls_client_ca",
            "fleet_ca",
            "fleet_cert",
            "fleet_key",
            "fleet_peer_ca",
            "advertise",
        ):
            values[key] = _typed(path, key, value, str)
        elif key in ("pool_size", "max_sandboxes", "host_handler_concurrency", "max_message_bytes"):
            values[key] = _typed(path, key, value, int)
        elif key in (
            "shutdown_grace_s",
            "host_handler_timeout_s",
            "quota_lease_ttl_s",
            "member_lease_ttl_s",
            "keepalive_interval_s",
            "keepalive_timeout_s",
        ):
            values[key] = float(_typed(path, key, value, (int, float)))
        elif key in ("allow_degraded", "docker", "global_quotas", "gvisor"):
            values[key] = _typed(path, key, value, bool)
        elif key in ("checkpoint_key", "checkpoint_dir"):
            values[key] = _typed(path, key, value, str)
        elif key == "checkpoint_interval_s":
            values[key] = float(_typed(path, key, value, (int, float)))
        else:
            raise InvalidArgument(f"config {path}: unknown key {key!r}")
    return ServerConfig(**values)


def _handler_limits(path: str | Path, value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidArgument(f"config {path}: host_handler_limits must be a table")
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key == "timeout_s":
            out["host_handler_timeout_s"] = float(_typed(path, key, item, (int, float)))
        elif key == "concurrency":
            out["host_handler_concurrency"] = _typed(path, key, item, int)
        else:
            raise InvalidArgument(f"config {path}: host_handler_limits: unknown key {key!r}")
    return out


def _typed(path: str | Path, key: str, value: object, kind: type | tuple[type, ...]) -> Any:
    if isinstance(value, bool) and kind is not bool:
        raise InvalidArgument(f"config {path}: {key} has the wrong type")
    if not isinstance(value, kind):
        raise InvalidArgument(f"config {path}: {key} has the wrong type")
    if isinstance(value, int | float) and not isinstance(value, bool) and value <= 0:
        raise InvalidArgument(f"config {path}: {key} must be positive")
    return value
