"""The server's memory under a burst of oversized requests, before and after the boundary caps.

Run: ``python -m bench.boundary [--rounds N] [--burst N]`` (needs bubblewrap, like the process
backend). Two real servers run side by side, each in its own process with the same tenants file
(one key) and a pool of one:

- ``before``: the server as it was, emulated: gRPC's receive limit at its old value (32 MiB plus
  the input-file bound, 98 MiB) and credentials checked only once the request was read (the
  error interceptor without the tenancy). Its decoder is today's, which refuses a script over
  its cap from the wire without building the string, so its figures are if anything lower
  than the old server's;
- ``after``: the server as it is: the receive limit from the documented caps
  (`sandbox.message_bounds.request_bytes_bound`, 72 MiB) and unary calls refused on their metadata.

Three bursts, each ``--burst`` requests sent 8 at a time over loopback:

1. ``unauthenticated``: 40 MB scripts with an unknown API key;
2. ``oversized``: authenticated requests of 80 MB (an input file): above the new receive limit,
   below the old one;
3. ``script``: authenticated 40 MB scripts (under both receive limits, over the 1 MiB script cap).

For each burst the two servers take turns in interleaved blocks (`bench.harness`, rotated
order, after a discarded warm-up block). A sample is the server's resident memory growth: its
peak during the burst (sampled every 10 ms) and what it still holds 1 s after, over its resident
memory just before (taken once neither server's memory is still falling from the last
burst). Printed per burst and server as p50/max in MiB, and the ratio of the peaks.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import sandbox  # noqa: F401  first: it configures gRPC's fork handling (see its __init__)

# isort: split
import grpc
import psutil

from bench.harness import Report, bench_parser, interleave_sync, percentile
from sandbox._proto import sandbox_pb2 as pb
from sandbox.limits import CEILINGS
from sandbox.message_bounds import request_files_bound
from sandbox.tenants.keys import hash_key

MiB = 1024**2
OLD_RECEIVE_LIMIT = 32 * MiB + request_files_bound(CEILINGS)
KEY = "bench-key"
CONCURRENCY = 8
SAMPLE_EVERY_S = 0.01
SETTLE_S = 1.0

SERVER_CODE = """
import asyncio, sys
import sandbox.server.app as app
from sandbox.server import SandboxServer, ServerConfig
from sandbox.server.interceptors import ErrorInterceptor

if sys.argv[1] == "before":
    app.RECEIVE_LIMIT_BYTES = int(sys.argv[3])
    app.ErrorInterceptor = lambda tenancy: ErrorInterceptor(None)

async def main():
    server = SandboxServer(ServerConfig(listen="127.0.0.1:0", pool_size=1, tenants=sys.argv[2]))
    print("listening on", await server.start(), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(1.0)

asyncio.run(main())
"""


class Served:
    def __init__(self, name: str, tenants: Path) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER_CODE, name, str(tenants), str(OLD_RECEIVE_LIMIT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise SystemExit(f"{name} server did not start: {line!r}")
        self.address = line.split()[-1]
        self.process = psutil.Process(self.proc.pid)
        self.channel = grpc.insecure_channel(
            self.address, options=[("grpc.max_send_message_length", -1)]
        )

    def rss(self) -> int:
        return int(self.process.memory_info().rss)

    def close(self) -> None:
        self.channel.close()
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _send(served: Served, data: bytes, key: str) -> grpc.StatusCode:
    # No serializers: the bytes go as they are.
    call = served.channel.unary_unary("/ptc.sandbox.v1.SandboxService/Execute", None, None)
    try:
        call(data, metadata=(("authorization", f"Bearer {key}"),), timeout=120)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def burst(
    served: Served, data: bytes, key: str, count: int, held: list[float], codes: set[str]
) -> float:
    """Sends ``count`` requests; returns the peak RSS growth in MiB, appends the held one."""
    before = served.rss()
    peak = before
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, served.rss())
            time.sleep(SAMPLE_EVERY_S)

    sampler = threading.Thread(target=sample)
    sampler.start()
    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        for code in pool.map(lambda _: _send(served, data, key), range(count)):
            codes.add(code.name)
    time.sleep(SETTLE_S)
    done.set()
    sampler.join()
    held.append((served.rss() - before) / MiB)
    return (peak - before) / MiB


def settle(servers: dict[str, Served]) -> None:
    """Waits (untimed, up to 10 s) until no server's memory is still falling from the last
    burst, so that one burst's release does not show as the next one's negative growth."""
    deadline = time.monotonic() + 10
    last = {name: s.rss() for name, s in servers.items()}
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = {name: s.rss() for name, s in servers.items()}
        if all(last[name] - now[name] < MiB for name in servers):
            return
        last = now


def main(report: Report, rounds: int, warmup: int, count: int) -> None:
    scripts = pb.ExecuteRequest(script="#" * (40 * 10**6)).SerializeToString()
    files = pb.ExecuteRequest(
        script="print(1)", input_files=[pb.InputFile(name="f", content=b"\0" * (80 * 10**6))]
    ).SerializeToString()
    bursts: dict[str, tuple[bytes, str]] = {
        "unauthenticated 40 MB": (scripts, "nobody"),
        "oversized 80 MB": (files, KEY),
        "script 40 MB": (scripts, KEY),
    }
    with tempfile.TemporaryDirectory() as tmp:
        tenants = Path(tmp) / "tenants.toml"
        tenants.write_text(f'[[tenant]]\nid = "bench"\nkeys = ["{hash_key(KEY)}"]\n')
        servers = {name: Served(name, tenants) for name in ("before", "after")}
        try:
            report.data("receive limit before (bytes)", OLD_RECEIVE_LIMIT)
            report.data("pid", os.getpid())
            for index, (title, (data, key)) in enumerate(bursts.items(), 1):
                report.section(f"{index}. {count} requests, {title}, {CONCURRENCY} at a time")
                held: dict[str, list[float]] = {name: [] for name in servers}
                codes: dict[str, set[str]] = {name: set() for name in servers}
                cases: dict[str, Callable[[], float]] = {
                    name: functools.partial(
                        burst, served, data, key, count, held[name], codes[name]
                    )
                    for name, served in servers.items()
                }
                peaks = interleave_sync(
                    cases, rounds, warmup=warmup, before=functools.partial(settle, servers)
                )
                for name in servers:
                    report.figure(
                        f"{name}: peak growth p50 / max",
                        percentile(peaks[name], 0.5),
                        "MiB",
                        note=f"max {max(peaks[name]):.0f} MiB; answers {sorted(codes[name])}",
                        fmt=".0f",
                    )
                    report.figure(
                        f"{name}: held 1 s after, p50",
                        percentile(held[name], 0.5),
                        "MiB",
                        fmt=".0f",
                    )
                before_peak = percentile(peaks["before"], 0.5)
                report.figure(
                    "peak after / before (p50)",
                    percentile(peaks["after"], 0.5) / before_peak if before_peak > 0 else 0.0,
                    "x",
                )
        finally:
            for served in servers.values():
                served.close()


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=3)
    parser.add_argument("--burst", type=int, default=8, help="requests per burst")
    args = parser.parse_args()
    with Report("boundary", args) as report:
        main(report, args.rounds, args.warmup, args.burst)
