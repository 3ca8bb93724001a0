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


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser("serve", help="run the gRPC server")
    parser.add_argument("--config", metavar="TOML", help="server config file")
    parser.add_argument("--listen", metavar="HOST:PORT", help="address (default 127.0.0.1:50051)")
    parser.add_argument("--pool-size", type=int, help="warm sandboxes kept ready")
    parser.add_argument(
        "--grace", type=float, metavar="SECONDS", help="time in-flight runs get at shutdown"
    )
    parser.add_argument(
        "--host-handler",
        action="append",
        default=[],
        metavar="TOOL=MODULE:FUNCTION",
        help="serve a host-mode tool with this callable (repeatable)",
    )
    parser.add_argument(
        "--audit-db",
        metavar="PATH|URL",
        help="audit store: SQLite file or postgresql:// URL (default ./ptc-audit.db; "
        "'memory' keeps records in memory only)",
    )
    parser.add_argument("--tenants", metavar="TOML", help="tenants file (default: one tenant)")
    parser.add_argument(
        "--runtimes-dir",
        metavar="DIR",
        help="where the runtimes requests may name are (`ptc runtime --dir`; default "
        "$PTC_RUNTIMES_DIR, as for `ptc run --runtime`)",
    )
    parser.add_argument("--instance-id", help="this server's id in a shared audit store")
    parser.add_argument(
        "--docker", action="store_true", default=None, help="also offer the Docker backend"
    )
    parser.add_argument(
        "--gvisor",
        action="store_true",
        default=None,
        help="also offer the Docker backend under gVisor (runsc), as backend 'gvisor'",
    )
    parser.add_argument(
        "--allow-degraded",
        action="store_true",
        default=None,
        help="run without cgroup limits or the seccomp filter when the host cannot provide them",
    )
    parser.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (e.g. 127.0.0.1:9464)",
    )
    parser.add_argument(
        "--quota-lease-ttl",
        type=float,
        metavar="SECONDS",
        help="with a PostgreSQL store: a crashed server's quota slots return after this",
    )
    parser.add_argument(
        "--member-lease-ttl",
        type=float,
        metavar="SECONDS",
        help="a server sharing the audit store that is silent this long is dead: a survivor "
        "marks its running records interrupted (default 15)",
    )
    parser.add_argument(
        "--checkpoint-interval",
        type=float,
        metavar="SECONDS",
        help="sign an audit checkpoint per tenant this often (default 300 once enabled)",
    )
    parser.add_argument(
        "--checkpoint-key", metavar="PEM", help="Ed25519 signing key (default: $PTC_CHECKPOINT_KEY)"
    )
    parser.add_argument(
        "--checkpoint-dir", metavar="DIR", help="write signed audit checkpoints here"
    )
    parser.add_argument(
        "--tls-cert", metavar="PEM", help="serve TLS with this certificate chain (needs --tls-key)"
    )
    parser.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    parser.add_argument(
        "--tls-client-ca",
        metavar="PEM",
        help="mTLS: require a client certificate issued by one of these CAs",
    )
    parser.add_argument(
        "--fleet-ca",
        metavar="PEM",
        help="the CA that issues the fleet's servers their client certificates (needs "
        "--tls-client-ca); only its certificates may carry calls between servers",
    )
    parser.add_argument(
        "--fleet-cert",
        metavar="PEM",
        help="this server's client certificate issued by the fleet CA, presented when it carries "
        "a session call to the server holding the session (needs --fleet-key and TLS)",
    )
    parser.add_argument("--fleet-key", metavar="PEM", help="the private key of --fleet-cert")
    parser.add_argument(
        "--fleet-peer-ca",
        metavar="PEM",
        help="the CAs of the other servers' TLS certificates (default: the system's)",
    )
    parser.add_argument(
        "--advertise",
        metavar="HOST:PORT",
        help="where the other servers of the fleet reach this one (default: the listen address)",
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
        quota_lease_ttl_s=getattr(args, "quota_lease_ttl", None),
        member_lease_ttl_s=getattr(args, "member_lease_ttl", None),
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
