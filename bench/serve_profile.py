"""Where a served execution's CPU goes: a real ``ptc serve``'s process, per execution, profiled.

Run: ``python -m bench.serve_profile [--executions N] [--concurrency C] [--rounds R]
[--baseline DIR] [--embedded] [--bare] [--raw-client] [--profile [--profile-out FILE]]
[--serve-arg=ARG ...]`` as root (cgroups, like the process backend), e.g. ``--rounds 7
--baseline /tmp/before --embedded``. Starts a real ``ptc serve`` as `bench.forkserver` does
(SQLite audit on, one tenant, loopback), runs ``print(1)`` through the client SDK
(`sandbox.client.AsyncClient`, the unary ``Execute``) N times at concurrency C, and prints per
block, then the median over ``--rounds`` blocks, the CPU per execution of:

- the server process (utime + stime from ``/proc/PID/stat``: every thread, not its children,
  so not the zygote's and not the sandboxes');
- its main thread (``/proc/PID/task/PID/stat``), the one the event loop runs on; the rest of the
  server is gRPC's own threads and the workers;
- the client (this process, every thread).

``--baseline DIR`` also starts the server of another checkout (a ``git worktree`` of an older
revision, run with ``PYTHONPATH=DIR`` and this venv) and alternates blocks between the two, in
an order rotated from round to round, so that the machine's load hits both alike; it prints
``this - baseline`` for each figure (``--baseline-serve-arg`` gives that server more arguments:
``--baseline . --baseline-serve-arg=--audit-db=memory`` is what the SQLite audit costs).
``--embedded`` also runs the same executions through an `Engine` in this process, in its own
alternating blocks, and prints ``this - embedded``: what serving adds to the engine. ``--bare``
also runs them through the engine behind a bare ``grpc.aio`` server (`_bare_engine_server`: the
real ``Execute``, none of our serving layers) and prints ``this - bare``: what our layers (the
interceptor, tenancy, the idempotency look-up, conversions, the audit) add to gRPC and the
engine; ``bare - embedded`` is gRPC's own cost in the engine's process. ``--raw-client`` also
runs this server (another process of it, with the same ``--serve-arg``) called by a bare
``grpc.aio`` stub instead of the SDK: ``this - raw`` is the SDK's own cost in the client. Every side
runs on the server's event loop (uvloop where installed). The audit database of each server
starts empty and grows by its executions, as a real server's does.

With ``--profile`` one more block runs with this
checkout's server under cProfile (``bench/_serve_profiled.py``: the event loop's thread, timed
by its own CPU clock) and prints its CPU by module and its costliest functions (profiling slows
Python code several times over and syscalls not at all: read its shares as where to look);
``--profile-out`` keeps its `pstats` file.

The machine is shared and noisy: CPU per execution moves less with the load than a rate, but a
difference under ~0.2 ms between single runs is noise; compare medians of alternating blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from grpc import aio

from bench import _serve_profiled
from bench.grpc import spawn, stop
from bench.harness import Report, bench_parser, run_in_slots
from bench.host_profile import print_profile
from sandbox._proto import sandbox_pb2 as pb
from sandbox.client import AsyncClient

ROOT = Path(__file__).resolve().parent.parent
WRAPPER = Path(__file__).resolve().parent / "_serve_profiled.py"
BARE = Path(__file__).resolve().parent / "_bare_engine_server.py"
TICKS = os.sysconf("SC_CLK_TCK")
EXECUTE = "/ptc.sandbox.v1.SandboxService/Execute"


def _stat_cpu_s(path: str) -> float:
    """utime + stime of a /proc stat file, in seconds (children not included)."""
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


class Server:
    """A real ``ptc serve`` from ``checkout`` under the profiling wrapper, and its client
    (``bare``: the engine behind a bare gRPC server instead, `bench._bare_engine_server`;
    ``raw_client``: a bare ``grpc.aio`` stub instead of the SDK, sending the least request that
    runs ``print(1)``, the script and an idempotency key as the SDK's, and reading the reply as
    a message, not an `ExecutionResult`)."""

    def __init__(
        self,
        name: str,
        checkout: Path,
        extra: list[str],
        bare: bool = False,
        raw_client: bool = False,
    ) -> None:
        self.name = name
        self.dir = tempfile.TemporaryDirectory(prefix="ptc-bench-serve-profile-")
        self.stats = f"{self.dir.name}/profile.stats"
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        args = [str(WRAPPER), self.stats, "serve", "--listen", "127.0.0.1:0",
                "--audit-db", f"{self.dir.name}/audit.db", *extra]  # fmt: skip
        if bare:
            args = [str(BARE)]
        self.proc, address = spawn(args, cwd=checkout, env=env)
        self.client = AsyncClient(address)
        self.raw: aio.Channel | None = aio.insecure_channel(address) if raw_client else None

    def cpu_s(self) -> tuple[float, float]:
        """(whole process, main thread) CPU seconds so far."""
        pid = self.proc.pid
        return _stat_cpu_s(f"/proc/{pid}/stat"), _stat_cpu_s(f"/proc/{pid}/task/{pid}/stat")

    async def block(self, executions: int, concurrency: int) -> dict[str, float]:
        """CPU per execution (ms) of one block: the server's, its main thread's, the client's."""

        async def one() -> None:
            result = await self.client.execute("print(1)")
            assert result.status == "ok" and result.stdout == "1\n", result.to_json()

        if self.raw is not None:
            execute = self.raw.unary_unary(
                EXECUTE,
                request_serializer=pb.ExecuteRequest.SerializeToString,
                response_deserializer=pb.ExecutionResult.FromString,
            )

            async def one() -> None:
                request = pb.ExecuteRequest(script="print(1)", idempotency_key=uuid.uuid4().hex)
                reply = await execute(request)
                assert reply.status == pb.EXECUTION_STATUS_OK and reply.stdout == "1\n", reply

        (process0, main0), client0 = self.cpu_s(), _own_cpu_s()
        await run_in_slots(one, executions, concurrency)
        (process1, main1), client1 = self.cpu_s(), _own_cpu_s()
        per = 1e3 / executions
        return {
            "server process": (process1 - process0) * per,
            "server main thread": (main1 - main0) * per,
            "server other threads": ((process1 - process0) - (main1 - main0)) * per,
            "client (this process)": (client1 - client0) * per,
        }

    async def profiled(self, executions: int, concurrency: int) -> str:
        """Runs one block under the server's profiler; returns the path of its stats."""
        self.proc.send_signal(_serve_profiled.START)
        await asyncio.sleep(0.2)  # the handler runs when the loop thread next runs Python
        await self.block(executions, concurrency)
        self.proc.send_signal(_serve_profiled.STOP)
        done = Path(self.stats + ".done")
        for _ in range(300):
            if done.exists():
                break
            await asyncio.sleep(0.1)
        return self.stats

    async def close(self) -> None:
        await self.client.close()
        if self.raw is not None:
            await self.raw.close(None)
        stop(self.proc)
        self.dir.cleanup()


class Embedded:
    """The same executions through an `Engine` in this process (what ``ptc serve`` wraps), on
    the same loop: its figures are this process's (``server process``), its loop thread's
    (``server main thread``) and nothing for a client."""

    name = "embedded"

    def __init__(self) -> None:
        from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig
        from sandbox.engine import Engine, EngineConfig

        self.backend = ProcessBackend(ProcessBackendConfig())
        self.engine = Engine(EngineConfig(backends={"process": self.backend}))

    async def start(self) -> None:
        await self.engine.start()
        await self.backend.pool.wait_ready()

    async def block(self, executions: int, concurrency: int) -> dict[str, float]:
        from sandbox.engine import ExecutionRequest

        async def one() -> None:
            result = await self.engine.execute(ExecutionRequest("print(1)"))
            assert result.status == "ok" and result.stdout == "1\n", result.to_json()

        process0, thread0 = _own_cpu_s(), time.thread_time()
        await run_in_slots(one, executions, concurrency)
        process1, thread1 = _own_cpu_s(), time.thread_time()
        per = 1e3 / executions
        return {
            "server process": (process1 - process0) * per,
            "server main thread": (thread1 - thread0) * per,
            "server other threads": ((process1 - process0) - (thread1 - thread0)) * per,
            "client (this process)": 0.0,
        }

    async def close(self) -> None:
        await self.engine.close()


async def main(report: Report, args: argparse.Namespace) -> None:
    rounds: int = args.rounds
    warmup: int = args.warmup
    executions: int = args.executions
    concurrency: int = args.concurrency
    baseline: str | None = args.baseline
    servers: list[Server | Embedded] = [Server("this", ROOT, args.serve_arg)]
    try:
        if baseline:
            servers.append(Server("baseline", Path(baseline).resolve(), args.baseline_serve_arg))
        if args.bare:
            servers.append(Server("bare", ROOT, [], bare=True))
        if args.raw_client:
            servers.append(Server("raw", ROOT, args.serve_arg, raw_client=True))
        if args.embedded:
            embedded = Embedded()
            servers.append(embedded)
            await embedded.start()
        for server in servers:
            for _ in range(warmup):
                await server.block(executions, concurrency)
        blocks: dict[str, list[dict[str, float]]] = {s.name: [] for s in servers}
        for round_ in range(rounds):
            order = servers[round_ % len(servers) :] + servers[: round_ % len(servers)]
            for server in order:
                figures = await server.block(executions, concurrency)
                blocks[server.name].append(figures)
                shown = "  ".join(f"{k} {v:.2f}" for k, v in figures.items())
                print(f"   block {round_ + 1} {server.name:<8} {shown}", flush=True)
        medians: dict[str, dict[str, float]] = {}
        for name, runs in blocks.items():
            report.section(f"{name}: print(1) x {executions} at concurrency {concurrency}, "
                           f"{rounds} blocks, CPU per execution (median)")  # fmt: skip
            medians[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            for label, value in medians[name].items():
                report.figure(label, value, "ms")
            report.data("blocks", runs)
        for other in ("baseline", "bare", "raw", "embedded"):
            if other in medians:
                report.section(f"this - {other}, CPU per execution (medians)")
                for label, value in medians["this"].items():
                    report.figure(label, value - medians[other][label], "ms")
        if "bare" in medians and "embedded" in medians:
            report.section("bare - embedded (gRPC in the engine's process), CPU per execution")
            for label, value in medians["bare"].items():
                report.figure(label, value - medians["embedded"][label], "ms")
        if args.profile:
            assert isinstance(servers[0], Server)
            stats = await servers[0].profiled(executions, concurrency)
            print_profile(stats, top=40)
            if args.profile_out:
                shutil.copyfile(stats, args.profile_out)
    finally:
        for server in servers:
            with contextlib.suppress(Exception):
                await server.close()


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=5, warmup=1)
    parser.add_argument("--executions", type=int, default=200, help="executions per block")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--baseline", metavar="DIR", help="another checkout's server to compare")
    parser.add_argument("--profile", action="store_true", help="profile one more block")
    parser.add_argument(
        "--embedded", action="store_true", help="also the engine in this process, alternating"
    )
    parser.add_argument(
        "--raw-client",
        action="store_true",
        help="also this server with a bare grpc.aio stub for a client, not the SDK",
    )
    parser.add_argument(
        "--bare",
        action="store_true",
        help="also the engine behind a bare gRPC server (bench/_bare_engine_server.py)",
    )
    parser.add_argument(
        "--serve-arg", action="append", default=[], help="one more argument for ptc serve"
    )
    parser.add_argument(
        "--baseline-serve-arg", action="append", default=[], help="the same for the baseline"
    )
    parser.add_argument("--profile-out", metavar="FILE", help="keep the profile's pstats here")
    parsed = parser.parse_args()
    from sandbox import eventloop

    with Report("serve_profile", parsed) as report:
        eventloop.run(main(report, parsed))  # the server's loop (uvloop), for both sides
