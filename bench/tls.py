"""What TLS costs: plaintext vs TLS vs mTLS against real `ptc serve` processes.

Run: ``.venv/bin/python -m bench.tls [--rounds 30]``. It makes a CA, a server certificate and a
client certificate (`tests.server.tls_support`), starts three servers (plaintext, ``--tls-cert``,
and ``--tls-client-ca`` for mTLS), and times, interleaved:

- a health check on an open channel (the transport's cost per call, no sandbox),
- a health check on a new channel each time (connection set-up: TCP, and the TLS handshake),
- ``print(1)`` executed on an open channel (what a client that keeps its `Client` pays).

All three servers share the machine's cores with the client, so compare within a section only.
"""

from __future__ import annotations

import asyncio
import functools
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.grpc import spawn, stop
from bench.harness import AsyncCase, Report, bench_parser, interleave, percentile
from sandbox.client import AsyncClient
from sandbox.client.tls import channel_credentials
from tests.server.tls_support import issue, make_ca

MODES = ("plaintext", "TLS", "mTLS")


async def _check(channel: aio.Channel) -> None:
    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        raise SystemExit(f"bench.tls: health {reply.status}")


async def main(report: Report, args: Any, tmp: Path) -> None:
    ca = make_ca(tmp, "bench-ca")
    server = issue(ca, tmp, "bench-server", server=True)
    client_ca = make_ca(tmp, "bench-clients-ca")
    client = issue(client_ca, tmp, "bench-client", server=False)
    base = ["-m", "sandbox.cli", "serve", "--listen", "127.0.0.1:0", "--pool-size", "2",
            "--audit-db", "memory"]  # fmt: skip
    tls = ["--tls-cert", str(server.cert), "--tls-key", str(server.key)]
    flags = {
        "plaintext": base,
        "TLS": [*base, *tls],
        "mTLS": [*base, *tls, "--tls-client-ca", str(client_ca.cert)],
    }
    creds: dict[str, dict[str, Any]] = {
        "plaintext": {},
        "TLS": {"tls_ca": str(ca.cert)},
        "mTLS": {"tls_ca": str(ca.cert), "tls_cert": str(client.cert), "tls_key": str(client.key)},
    }
    procs = []
    try:
        addresses = {}
        for mode in MODES:
            proc, addresses[mode] = spawn(flags[mode])
            procs.append(proc)

        def channel(mode: str) -> aio.Channel:
            credentials = channel_credentials(**creds[mode])
            if credentials is None:
                return aio.insecure_channel(addresses[mode])
            return aio.secure_channel(addresses[mode], credentials)

        channels = {mode: channel(mode) for mode in MODES}
        clients = {mode: AsyncClient(addresses[mode], **creds[mode]) for mode in MODES}

        def fresh(mode: str) -> Callable[[], Awaitable[None]]:
            async def once() -> None:
                async with channel(mode) as new:
                    await _check(new)

            return once

        def execute(mode: str) -> Callable[[], Awaitable[None]]:
            async def once() -> None:
                result = await clients[mode].execute("print(1)")
                if result.stdout != "1\n":
                    raise SystemExit(f"bench.tls: {result.status} {result.stderr[-300:]!r}")

            return once

        sections: dict[str, dict[str, AsyncCase]] = {
            "1. health check on an open channel": {
                m: functools.partial(_check, channels[m]) for m in MODES
            },
            "2. health check on a new channel (connection set-up included)": {
                m: fresh(m) for m in MODES
            },
            "3. print(1) executed on an open channel": {m: execute(m) for m in MODES},
        }
        try:
            for title, cases in sections.items():
                times = await interleave(cases, args.rounds, warmup=args.warmup)
                report.section(title)
                for label, values in times.items():
                    report.timings(label, values)
                plain = percentile(times["plaintext"], 0.5)
                for mode in ("TLS", "mTLS"):
                    report.figure(
                        f"{mode} - plaintext, p50",
                        (percentile(times[mode], 0.5) - plain) * 1000,
                        "ms",
                    )
        finally:
            for ch in channels.values():
                await ch.close(None)
            for c in clients.values():
                await c.close()
    finally:
        for proc in procs:
            stop(proc)


if __name__ == "__main__":
    arguments = bench_parser(__doc__, rounds=30, warmup=3).parse_args()
    with Report("tls", arguments) as report, tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(report, arguments, Path(tmp)))
