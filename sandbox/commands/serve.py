"""`ptc serve [--listen HOST:PORT] [--config server.toml] ...`: run the gRPC server.

Prints ``listening on HOST:PORT`` (the real port when asked for port 0) on stdout once it accepts
requests. SIGTERM or SIGINT stop it gracefully: health and readiness turn NOT_SERVING at once and
new executions get UNAVAILABLE while it still listens, in-flight executions get the grace period
to finish and are then stopped and recorded as `interrupted`, the listener closes, the warm pool
is drained, and the process exits 0 with no sandbox left behind. With a PostgreSQL audit store,
tenants' quotas hold across every server sharing it (``--quota-lease-ttl``). With ``--tls-cert``
and ``--tls-key`` it serves TLS (re-reading the files when they change), and with
``--tls-client-ca`` it requires client certificates (mTLS); see docs/server.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from dataclasses import replace
from typing import Any

from sandbox import eventloop
from sandbox.server import SandboxServer, ServerConfig, load_config
from sandbox.telemetry.stacks import dump_stacks

__all__ = ["register", "run"]

DEFAULT_AUDIT_DB = "ptc-audit.db"
LEFTOVER_GRACE_S = 5.0  # what a task still running at exit gets after its cancel


# `ptc serve`'s options, as the tables they are. Each one is None when not given, so that
# `ServerConfig.with_overrides` keeps the config file's value for it.
_VALUE_OPTIONS = (  # (flag, metavar, help)
    ("--config", "TOML", "server config file"),
    ("--listen", "HOST:PORT", "address (default 127.0.0.1:50051)"),
    (
        "--audit-db",
        "PATH|URL",
        "audit store: SQLite file or postgresql:// URL (default ./ptc-audit.db; "
        "'memory' keeps records in memory only)",
    ),
    ("--tenants", "TOML", "tenants file (default: one tenant)"),
    (
        "--runtimes-dir",
        "DIR",
        "where the runtimes requests may name are (`ptc runtime --dir`; default "
        "$PTC_RUNTIMES_DIR, as for `ptc run --runtime`)",
    ),
    ("--instance-id", None, "this server's id in a shared audit store"),
    (
        "--metrics-listen",
        "HOST:PORT",
        "serve Prometheus metrics at http://HOST:PORT/metrics (e.g. 127.0.0.1:9464)",
    ),
    ("--checkpoint-key", "PEM", "Ed25519 signing key (default: $PTC_CHECKPOINT_KEY)"),
    ("--checkpoint-dir", "DIR", "write signed audit checkpoints here"),
    ("--tls-cert", "PEM", "serve TLS with this certificate chain (needs --tls-key)"),
    ("--tls-key", "PEM", "the private key of --tls-cert"),
    ("--tls-client-ca", "PEM", "mTLS: require a client certificate issued by one of these CAs"),
    (
        "--fleet-ca",
        "PEM",
        "the CA that issues the fleet's servers their client certificates (needs "
        "--tls-client-ca); only its certificates may carry calls between servers",
    ),
    (
        "--fleet-cert",
        "PEM",
        "this server's client certificate issued by the fleet CA, presented when it carries "
        "a session call to the server holding the session (needs --fleet-key and TLS)",
    ),
    ("--fleet-key", "PEM", "the private key of --fleet-cert"),
    (
        "--fleet-peer-ca",
        "PEM",
        "the CAs of the other servers' TLS certificates (default: the system's)",
    ),
    (
        "--advertise",
        "HOST:PORT",
        "where the other servers of the fleet reach this one (default: the listen address)",
    ),
)
_SECONDS_OPTIONS = (  # (flag, help)
    ("--grace", "time in-flight runs get at shutdown"),
    (
        "--quota-lease-ttl",
        "with a PostgreSQL store: a crashed server's quota slots return after this",
    ),
    (
        "--member-lease-ttl",
        "a server sharing the audit store that is silent this long is dead: a survivor "
        "marks its running records interrupted (default 15)",
    ),
    (
        "--keepalive-interval",
        "ping a client after this long without data on its connection (default 60) ...",
    ),
    (
        "--keepalive-timeout",
        "... and cancel its calls, killing their executions, when it does not answer within "
        "this (default 20)",
    ),
    (
        "--checkpoint-interval",
        "sign an audit checkpoint per tenant this often (default 300 once enabled)",
    ),
)
_SWITCHES = (  # (flag, help)
    ("--docker", "also offer the Docker backend"),
    ("--gvisor", "also offer the Docker backend under gVisor (runsc), as backend 'gvisor'"),
    (
        "--allow-degraded",
        "run without cgroup limits or the seccomp filter when the host cannot provide them",
    ),
)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser("serve", help="run the gRPC server")
    for flag, metavar, text in _VALUE_OPTIONS:
        parser.add_argument(flag, metavar=metavar, help=text)
    for flag, text in _SECONDS_OPTIONS:
        parser.add_argument(flag, type=float, metavar="SECONDS", help=text)
    for flag, text in _SWITCHES:
        parser.add_argument(flag, action="store_true", default=None, help=text)
    parser.add_argument("--pool-size", type=int, help="warm sandboxes kept ready")
    parser.add_argument(
        "--host-handler",
        action="append",
        default=[],
        metavar="TOOL=MODULE:FUNCTION",
        help="serve a host-mode tool with this callable (repeatable)",
    )
    parser.set_defaults(handler=run)


def _config(args: argparse.Namespace) -> ServerConfig:
    config = load_config(args.config) if args.config else ServerConfig()
    handlers = dict(config.host_handlers)
    for item in args.host_handler:
        tool, sep, spec = item.partition("=")
        if not sep or not tool:
            from sandbox.errors import InvalidArgument

            raise InvalidArgument(f"--host-handler {item!r}: expected TOOL=MODULE:FUNCTION")
        handlers[tool] = spec
    audit_db = args.audit_db or config.audit_db or DEFAULT_AUDIT_DB
    config = replace(config, audit_db=None if audit_db == "memory" else audit_db)
    return config.with_overrides(
        tenants=args.tenants,
        runtimes_dir=args.runtimes_dir,
        instance_id=args.instance_id,
        docker=args.docker,
        gvisor=args.gvisor,
        listen=args.listen,
        pool_size=args.pool_size,
        shutdown_grace_s=args.grace,
        allow_degraded=args.allow_degraded,
        host_handlers=handlers,
        metrics_listen=args.metrics_listen,
        quota_lease_ttl_s=args.quota_lease_ttl,
        member_lease_ttl_s=args.member_lease_ttl,
        keepalive_interval_s=args.keepalive_interval,
        keepalive_timeout_s=args.keepalive_timeout,
        checkpoint_interval_s=args.checkpoint_interval,
        checkpoint_key=args.checkpoint_key,
        checkpoint_dir=args.checkpoint_dir,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        fleet_ca=args.fleet_ca,
        fleet_cert=args.fleet_cert,
        fleet_key=args.fleet_key,
        fleet_peer_ca=args.fleet_peer_ca,
        advertise=args.advertise,
    )


async def _serve(config: ServerConfig) -> None:
    server = SandboxServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_stop_signal() -> None:
        if not stop.is_set():
            stop.set()  # drain: in-flight executions get the grace
            return
        # Again (Ctrl-C twice): no more grace, the stop goes on as it would after it.
        held = server.runner.hurry()
        with contextlib.suppress(OSError):
            print(
                f"ptc serve: stopping now: {held} executions still running or queued are "
                "stopped (those running recorded interrupted)",
                file=sys.stderr,
                flush=True,
            )

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_stop_signal)
    loop.add_signal_handler(signal.SIGUSR1, dump_stacks)  # what it waits on, to stderr
    address = await server.start()
    try:
        # Inside the try: a reader gone (`ptc serve | head -1`) still stops the server cleanly.
        if server.metrics_address:
            print(f"metrics on {server.metrics_address}", flush=True)
        print(f"listening on {address}", flush=True)
        if server.backend_error:
            print(f"ptc serve: not serving executions: {server.backend_error}", file=sys.stderr)
        await stop.wait()
    finally:
        with contextlib.suppress(OSError):  # a closed stderr must not skip the stop
            print("shutting down", file=sys.stderr, flush=True)
        await server.stop()


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("sandbox.audit.publisher").setLevel(logging.INFO)  # the checkpoint lines
    # The stop has drained, recorded and released everything; a task that ignores its cancel
    # (a host handler's coroutine that catches CancelledError) must not keep the process.
    eventloop.run(_serve(_config(args)), leftover_grace_s=LEFTOVER_GRACE_S)
    return 0
