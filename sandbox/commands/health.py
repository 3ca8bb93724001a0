"""`ptc health [--server HOST:PORT] [--ready]`: ask a server's gRPC health service.

Without ``--ready`` it asks about liveness (the whole server, service name ``""``); with
``--ready`` about readiness (``ptc.sandbox.v1.Readiness``: warm pool, reachable audit store,
not draining). Prints the status (``SERVING``, ``NOT_SERVING``) and exits 0 when serving, 1 when
not, and 12 (unavailable) when the server does not answer within ``--timeout``. A Kubernetes
probe can call the health service directly (``grpc: {port, service}``) or run this command.
"""

from __future__ import annotations

import argparse
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandbox.client.tls import channel_credentials
from sandbox.commands._client_tls import add_tls_options, tls_options
from sandbox.errors import Unavailable
from sandbox.server.fleet import READINESS_SERVICE

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "health",
        help="ask a server whether it is serving (or, with --ready, ready for work)",
        description="Ask a ptc server's gRPC health service; exit 0 when serving.",
    )
    parser.add_argument(
        "--server", default="127.0.0.1:50051", metavar="HOST:PORT", help="server address"
    )
    parser.add_argument(
        "--ready", action="store_true", help=f"ask about readiness ({READINESS_SERVICE})"
    )
    parser.add_argument(
        "--service", default=None, help="ask about another service name (default: the server)"
    )
    parser.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS")
    add_tls_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    service = READINESS_SERVICE if args.ready else (args.service or "")
    credentials = channel_credentials(**tls_options(args))
    channel = (
        grpc.insecure_channel(args.server)
        if credentials is None
        else grpc.secure_channel(args.server, credentials)
    )
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=args.timeout)
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.NOT_FOUND:
                print(f"UNKNOWN: the server has no health status for {service!r}")
                return 1
            raise Unavailable(f"server {args.server}: {exc.details()}") from exc
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(name)
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1
