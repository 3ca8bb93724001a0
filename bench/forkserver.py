"""Fork-server benchmark: what a sandbox costs a shared service, against the isolation floor.

Run: ``python -m bench.forkserver [--rounds N] [--per-block N]`` as root (cgroups, like the
process backend). In interleaved blocks, so that a noisy neighbour hits every way alike:

1. the isolation floor (`bench.floor`: exactly our isolation per sandbox and nothing else, host
   and zygote in one process) at concurrency 4 and 32;
2. sustained executions/s of ``print(1)`` through the embedded `Engine` (process backend, forked
   sandboxes) at concurrency 4 and 32;
3. the same through a real ``ptc serve`` (SQLite audit on, one tenant) and a gRPC client in this
   process, at concurrency 4 and 32;
4. for each of those three, CPU per execution by process: the machine's (from /proc/stat), the
   host's, the zygote's, the sandboxes' (their cgroups: for the engine and ``ptc serve`` their
   parent cgroup's, which keeps each sandbox's CPU through its exit, as the floor's figures
   do; `bench.floor.sandbox_cgroups_cpu_s`), the kernel's threads', and the rest (interrupts,
   other load, each sandbox's CPU before it joins its cgroup); and the
   floor's machine CPU per execution over the engine's and over ``ptc serve``'s, block by block
   (median and range): the rate ratios on a machine every way kept equally busy, steadier
   than the rates, which the machine's other load moves by 0.05-0.1 from run to run;
   and, at concurrency 4, what ``ptc serve`` adds to the engine part by part, with the same
   server's audit in memory as one more way (`bench.serve_budget`: gRPC alone, the SQLite audit,
   the rest of serving, and the best ratio those parts leave ``ptc serve``);
5. reference lines, not targets: the bare fork+unshare (a pre-imported parent forks a child
   that unshares mount, uts, ipc and network namespaces and prints: no cgroup, no pid
   namespace, no mounts, no bootstrap, so less work than a sandbox), a bare ``bwrap
   --unshare-all python3 -I -S -c 'print(1)'`` per execution; optionally the code before the
   fork server (``--legacy-rev``, run from a git worktree in a subprocess) and, where a Docker
   engine and the runtime image are there (``PTC_DOCKER_HOST``), the Docker backend
   (``--docker-per-block`` executions a block); and a bare gRPC unary call at concurrency 4
   whose method only waits, on average, as long as the last served ``print(1)`` took (each call
   a different time, as served executions do: `bench.grpc_floor`): what gRPC alone costs each
   served execution, server and client, at that rate.

Then, once: warm ``print(1)`` p50 beside ``python3 -I -S -c pass``; an idle pooled sandbox's
private memory (USS of its processes: one with pidfds, two with a reaper) and cgroup charge;
what replacing the zygote costs.
Targets: the engine >= 0.85x the floor at concurrency 4 and 32; ``ptc serve`` >= 0.70x
the floor; idle USS <= 2 MiB; print(1) p50 <= 0.3x python3 -I -S -c pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import psutil

from bench.floor import STEPS, Floor, busy_cpu_s, kernel_threads_cpu_s, sandbox_cgroups_cpu_s
from bench.grpc import spawn, stop
from bench.grpc_floor import BareGrpc
from bench.harness import Report, bench_parser, interleave, percentile, run_in_slots
from bench.serve_budget import SERVED_IN_MEMORY, print_serving_budget
from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig
from sandbox.backends.process.bwrap import bwrap_path
from sandbox.client import AsyncClient
from sandbox.engine import Engine, EngineConfig, ExecutionRequest
from sandbox.result import ExecutionResult

__all__ = ["busy_cpu_s", "zygote_cpu_s"]  # forkserver_cost's, besides this benchmark

ROOT = Path(__file__).resolve().parent.parent
REAL_PYTHON = os.path.realpath("/usr/bin/python3")

FLOOR = r"""
import asyncio, ast, inspect, json, os, sys, typing, traceback, ctypes
libc = ctypes.CDLL(None, use_errno=True)
flags = 0x00020000 | 0x04000000 | 0x08000000 | 0x40000000  # mnt, uts, ipc, net
total, concurrency = int(sys.argv[1]), int(sys.argv[2])
running, started, done = {}, 0, 0
t = __import__("time").perf_counter()
while done < total:
    while started < total and len(running) < concurrency:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            if libc.unshare(flags) != 0:
                os._exit(3)
            os.write(w, b"1\n")
            os._exit(0)
        os.close(w)
        running[pid] = r
        started += 1
    pid, status = os.wait()
    r = running.pop(pid)
    assert os.read(r, 16) == b"1\n" and status == 0, status
    os.close(r)
    done += 1
print(total / (__import__("time").perf_counter() - t))
"""

LEGACY = r"""
import asyncio, sys, time
from sandbox.engine import Engine, ExecutionRequest
async def main(total, concurrencies):
    async with Engine() as engine:
        await engine.backend("process").pool.wait_ready()
        sys.stdout.write("ready\n"); sys.stdout.flush()
        for line in sys.stdin:
            concurrency = int(line)
            slots = asyncio.Semaphore(concurrency)
            async def one():
                async with slots:
                    r = await engine.execute(ExecutionRequest("print(1)"))
                    assert r.status == "ok", r.to_json()
            t = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(total)))
            sys.stdout.write(f"{total / (time.perf_counter() - t)}\n"); sys.stdout.flush()
asyncio.run(main(int(sys.argv[1]), None))
"""


def zygote_cpu_s(backend: ProcessBackend) -> float:
    """CPU seconds of the backend's zygotes alive now (their forks and requests)."""
    return _cpu_s(backend.zygote.pids() if backend.zygote is not None else [])


def _cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            cpu = psutil.Process(pid).cpu_times()
            total += cpu.user + cpu.system
    return total


def own_cpu_s() -> float:
    """CPU seconds of this process, every thread (not its children)."""
    times = os.times()
    return times.user + times.system


class Served:
    """A real ``ptc serve`` (SQLite audit on, one tenant; ``audit_in_memory``: its audit in
    memory only) and a gRPC client in this process."""

    def __init__(self, audit_in_memory: bool = False) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="ptc-bench-serve-")
        audit_db = "memory" if audit_in_memory else f"{self.dir.name}/audit.db"
        self.proc, self.address = spawn(
            ["-m", "sandbox.cli", "serve", "--listen", "127.0.0.1:0", "--audit-db", audit_db]
        )  # fmt: skip
        self.client = AsyncClient(self.address)

    def zygote_pids(self) -> list[int]:
        """bwrap's and the zygote's host pids under the server (no sandbox: those are the
        zygote's children)."""
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.proc.pid).children():
                if child.name() == "bwrap":
                    return [child.pid, *(p.pid for p in child.children())]
        return []

    def cpu_s(self) -> dict[str, float]:
        return {
            "server process": _cpu_s([self.proc.pid]),
            "zygote": _cpu_s(self.zygote_pids()),
            "client (this process)": own_cpu_s(),
        }

    async def close(self) -> None:
        await self.client.close()
        stop(self.proc)
        self.dir.cleanup()


async def breakdown(
    execute: Callable[[], Awaitable[ExecutionResult]],
    processes: Callable[[], dict[str, float]],
    sandboxes: Callable[[], float],
    total: int,
    concurrency: int,
) -> dict[str, float]:
    """One block: executions/s, and CPU per execution (ms) by process: the machine's (every
    process, other load included), each of ``processes`` (cumulative CPU seconds by name), the
    sandboxes' (``sandboxes``: cumulative CPU seconds of their cgroups, exits included), the
    kernel's threads', and the rest (interrupts, other load)."""

    async def one() -> None:
        result = await execute()
        assert result.status == "ok" and result.stdout == "1\n", result.to_json()

    machine, kernel, before = busy_cpu_s(), kernel_threads_cpu_s(), processes()
    sandbox_cpu = sandboxes()
    t = time.perf_counter()
    await run_in_slots(one, total, concurrency)
    elapsed = time.perf_counter() - t
    after, kernel = processes(), kernel_threads_cpu_s() - kernel
    sandbox_cpu = sandboxes() - sandbox_cpu
    machine = busy_cpu_s() - machine
    per = 1e3 / total
    figures = {"executions/s": total / elapsed, "machine CPU": machine * per}
    rest = machine - sandbox_cpu - kernel
    for name, value in after.items():
        figures[name] = (value - before.get(name, 0.0)) * per
        rest -= value - before.get(name, 0.0)
    figures["sandboxes (their cgroups)"] = sandbox_cpu * per
    figures["kernel threads"] = kernel * per
    figures["rest (interrupts, other load)"] = rest * per
    return figures


async def plain_rate(engine: Engine, total: int, concurrency: int) -> float:
    """Executions/s of print(1) through ``engine`` (its default backend)."""

    async def one() -> None:
        result = await engine.execute(ExecutionRequest("print(1)"))
        assert result.status == "ok" and result.stdout == "1\n", result.to_json()

    started = time.perf_counter()
    await run_in_slots(one, total, concurrency)
    return total / (time.perf_counter() - started)


def floor_rate(total: int, concurrency: int) -> float:
    out = subprocess.run(
        [REAL_PYTHON, "-I", "-S", "-c", FLOOR, str(total), str(concurrency)],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout)


def bwrap_rate(total: int, concurrency: int) -> float:
    bwrap = bwrap_path()
    assert bwrap is not None
    argv = [
        bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
        "--proc", "/proc", "--dev", "/dev", "--", REAL_PYTHON, "-I", "-S", "-c", "print(1)",
    ]  # fmt: skip
    running: list[subprocess.Popen[bytes]] = []
    t, started = time.perf_counter(), 0
    while started < total or running:
        while started < total and len(running) < concurrency:
            running.append(subprocess.Popen(argv, stdout=subprocess.PIPE))
            started += 1
        proc = running.pop(0)
        out, _ = proc.communicate()
        assert out == b"1\n" and proc.returncode == 0
    return total / (time.perf_counter() - t)


class Legacy:
    """The code before the fork server, in its own worktree and process."""

    def __init__(self, rev: str, total: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ptc-bench-legacy-"))
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(self.dir), rev],
            check=True,
            capture_output=True,
        )
        env = {**os.environ, "PYTHONPATH": str(self.dir)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LEGACY, str(total)],
            cwd=self.dir,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready", "legacy engine did not start"

    def rate(self, concurrency: int) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{concurrency}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(60)
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(self.dir)],
            check=False,
            capture_output=True,
        )


async def latency(report: Report, engine: Engine, backend: ProcessBackend, rounds: int) -> None:
    async def ours() -> None:
        result = await engine.execute(ExecutionRequest("print(1)"))
        assert result.status == "ok"

    def bare() -> None:
        subprocess.run([REAL_PYTHON, "-I", "-S", "-c", "pass"], check=True)

    async def settle() -> None:
        await backend.pool.wait_ready()
        await asyncio.sleep(0.02)

    times = await interleave(
        {"print(1), warm": ours, "python3 -I -S -c pass": lambda: asyncio.to_thread(bare)},
        rounds,
        before=settle,
    )
    for label, values in times.items():
        report.timings(label, values)
    ratio = percentile(times["print(1), warm"], 0.5) / percentile(
        times["python3 -I -S -c pass"], 0.5
    )
    report.figure("ratio of p50s", ratio, "x", note="target <= 0.3")


def idle_memory(report: Report, backend: ProcessBackend) -> None:
    for index, handle in enumerate(list(backend.pool._idle)):
        charge = 0
        for path in handle.cgroup.paths if handle.cgroup else []:
            for name in ("memory.usage_in_bytes", "memory.current"):
                if (path / name).exists():
                    charge = int((path / name).read_text())
        procs = [psutil.Process(handle.pid)]
        procs += procs[0].children(recursive=True)
        uss = sum(p.memory_full_info().uss for p in procs)
        report.figure(
            f"idle sandbox {index}: USS of its {len(procs)} processes",
            uss / 2**20,
            "MiB",
            note="target <= 2",
        )
        report.figure(f"idle sandbox {index}: cgroup charge", charge / 2**20, "MiB")


async def rotation_cost(report: Report, backend: ProcessBackend, rounds: int = 5) -> None:
    zygote = backend.zygote
    assert zygote is not None
    times = []
    for _ in range(rounds):
        cpu = busy_cpu_s()
        t = time.perf_counter()
        await asyncio.to_thread(zygote.replace)
        times.append((time.perf_counter() - t, busy_cpu_s() - cpu))
    wall = percentile([x[0] for x in times], 0.5)
    cpu = percentile([x[1] for x in times], 0.5)
    limit = backend.config.zygote_max_forks
    report.figure("replacing the zygote, wall", wall * 1e3, "ms")
    report.figure("replacing the zygote, machine CPU", cpu * 1e3, "ms")
    report.figure(f"the same per execution, every {limit} forks", cpu / limit * 1e6, "us")


async def docker_engine() -> Engine | None:
    """An engine on the Docker backend, or None (said why) where none can run containers."""
    from sandbox.backends.docker.backend import DockerBackend, DockerBackendConfig

    backend = DockerBackend(DockerBackendConfig(pool_size=4))
    engine = Engine(EngineConfig(backends={"docker": backend}, default_backend="docker"))
    await engine.start()
    if backend.unavailable_reason:
        print(f"the Docker backend's rate is not measured: {backend.unavailable_reason}")
        await engine.close()
        return None
    await backend.pool.wait_ready(timeout=120)
    return engine


SECTIONS_CPU = (
    "machine CPU",
    "host process",
    "host and zygote (one process)",
    "server process",
    "client (this process)",
    "zygote",
    "sandboxes (fork to exit)",
    "sandboxes (their cgroups)",
    "kernel threads",
    "rest (interrupts, other load)",
)


def print_breakdowns(report: Report, breakdowns: dict[str, list[dict[str, float]]]) -> None:
    """CPU per execution by process, medians over the timed blocks, one line per way."""
    for name, blocks in breakdowns.items():
        parts = []
        for label in SECTIONS_CPU:
            if label in blocks[0]:
                value = percentile([b[label] for b in blocks], 0.5)
                parts.append(f"{label} {value:.2f}")
                report.data(f"{name}: {label} (ms) samples", [b[label] for b in blocks])
        report.print(f"   {name}: " + ", ".join(parts))


def print_cpu_ratios(report: Report, breakdowns: dict[str, list[dict[str, float]]]) -> None:
    """The floor's machine CPU per execution over each way's, block by block (each block ran
    every way once, one after the other), with their median and range: what the rate ratios
    above would be on a machine that every way kept equally busy. Steadier than a rate, which
    the machine's other load and a way's idle moments move; the targets are the rates."""
    for c in (4, 32):
        floor = breakdowns.get(f"isolation floor c={c}", [])
        for name, label in (("embedded engine", "engine"), ("ptc serve + gRPC", "ptc serve")):
            ways = breakdowns.get(f"{name} c={c}", [])
            ratios = [f["machine CPU"] / w["machine CPU"] for f, w in zip(floor, ways, strict=True)]
            if not ratios:
                continue
            report.figure(
                f"machine CPU: floor / {label}, c={c}",
                percentile(ratios, 0.5),
                "x",
                note=f"blocks {min(ratios):.2f}-{max(ratios):.2f}",
            )
            report.data(f"floor / {label} machine CPU c={c} samples", ratios)


async def main(
    report: Report,
    rounds: int,
    warmup: int,
    per_block: int,
    legacy_rev: str | None,
    docker_per_block: int,
) -> None:
    backend = ProcessBackend(ProcessBackendConfig())
    engine = Engine(EngineConfig(backends={"process": backend}))
    legacy = Legacy(legacy_rev, per_block) if legacy_rev else None
    floor = Floor()
    served = Served()
    served_in_memory = Served(audit_in_memory=True)
    bare_grpc = BareGrpc()
    breakdowns: dict[str, list[dict[str, float]]] = {}
    await engine.start()
    docker = await docker_engine() if docker_per_block else None
    try:
        await backend.pool.wait_ready()
        cases: dict[str, Callable[[], Awaitable[float]]] = {}

        def keep(name: str, figures: dict[str, float]) -> float:
            breakdowns.setdefault(name, []).append(figures)
            return figures["executions/s"]

        for c in (4, 32):

            async def isolation_floor(c: int = c) -> float:
                figures = await asyncio.to_thread(floor.block, per_block, c, STEPS)
                return keep(f"isolation floor c={c}", figures)

            async def ours(c: int = c) -> float:
                figures = await breakdown(
                    lambda: engine.execute(ExecutionRequest("print(1)")),
                    lambda: {"host process": own_cpu_s(), "zygote": zygote_cpu_s(backend)},
                    lambda: sandbox_cgroups_cpu_s(os.getpid()),
                    per_block,
                    c,
                )
                return keep(f"embedded engine c={c}", figures)

            async def serve(c: int = c) -> float:
                figures = await breakdown(
                    lambda: served.client.execute("print(1)"),
                    served.cpu_s,
                    lambda: sandbox_cgroups_cpu_s(served.proc.pid),
                    per_block,
                    c,
                )
                return keep(f"ptc serve + gRPC c={c}", figures)

            cases[f"isolation floor c={c}"] = isolation_floor
            cases[f"embedded engine c={c}"] = ours
            cases[f"ptc serve + gRPC c={c}"] = serve
        if legacy is not None:
            for c in (4, 32):

                async def old(c: int = c) -> float:
                    return await asyncio.to_thread(legacy.rate, c)

                cases[f"before the fork server c={c}"] = old

        async def bare() -> float:
            return await asyncio.to_thread(floor_rate, per_block, 4)

        async def bwrap() -> float:
            return await asyncio.to_thread(bwrap_rate, per_block, 4)

        async def grpc_alone() -> float:
            # As long as a served print(1) took in the last block (concurrency / rate).
            served_blocks = breakdowns.get("ptc serve + gRPC c=4")
            delay_s = 4 / served_blocks[-1]["executions/s"] if served_blocks else 0.03
            machine = busy_cpu_s()
            figures = await bare_grpc.block(per_block, 4, delay_s)
            figures["machine CPU"] = (busy_cpu_s() - machine) * 1e3 / per_block
            figures["executions/s"] = figures.pop("calls/s")
            return keep("reference: bare gRPC unary c=4", figures)

        async def serve_in_memory() -> float:
            figures = await breakdown(
                lambda: served_in_memory.client.execute("print(1)"),
                served_in_memory.cpu_s,
                lambda: sandbox_cgroups_cpu_s(served_in_memory.proc.pid),
                per_block,
                4,
            )
            return keep(SERVED_IN_MEMORY, figures)

        cases[SERVED_IN_MEMORY] = serve_in_memory
        cases["reference: bare fork+unshare c=4"] = bare
        cases["reference: bare bwrap python3 -c c=4"] = bwrap
        cases["reference: bare gRPC unary c=4"] = grpc_alone
        if docker is not None:

            async def containers(engine: Engine = docker) -> float:
                return await plain_rate(engine, docker_per_block, 4)

            cases["Docker backend c=4"] = containers

        async def settle() -> None:
            # Both pools full and idle (the served one is not ours to wait for: a pause
            # several times its refill) before anything is timed.
            await backend.pool.wait_ready()
            await asyncio.sleep(0.3)

        # Warm the served side's pool and connection before the first block.
        await served.client.execute("print(1)")
        await served_in_memory.client.execute("print(1)")
        report.section(
            f"1. sustained executions/s of print(1), {rounds} interleaved blocks of {per_block}"
        )
        rates = await interleave(cases, rounds, warmup=warmup, before=settle)
        med = {name: percentile(values, 0.5) for name, values in rates.items()}
        for name, value in med.items():
            report.figure(name, value, "executions/s", fmt=".1f")
            report.data(f"{name} samples", rates[name])
        for c in (4, 32):
            base = med[f"isolation floor c={c}"]
            report.figure(
                f"embedded engine / isolation floor, c={c}",
                med[f"embedded engine c={c}"] / base,
                "x",
                note=">= 0.85",
            )
            report.figure(
                f"ptc serve / isolation floor, c={c}",
                med[f"ptc serve + gRPC c={c}"] / base,
                "x",
                note=">= 0.70",
            )
        if legacy is not None:
            for c in (4, 32):
                ratio = med[f"embedded engine c={c}"] / med[f"before the fork server c={c}"]
                report.figure(f"ours / before the fork server, c={c}", ratio, "x")
        if docker is not None:
            ratio = med["embedded engine c=4"] / med["Docker backend c=4"]
            report.figure("ours / Docker backend, c=4", ratio, "x")
        report.section("2. CPU per execution by process, ms (medians of the timed blocks)")
        # Every block ran each case once, the warm-up blocks first: theirs are not counted.
        timed = {k: v[warmup:] for k, v in breakdowns.items()}
        print_breakdowns(report, timed)
        print_cpu_ratios(report, timed)
        print_serving_budget(report, timed)
        report.section("3. warm print(1) latency")
        await latency(report, engine, backend, 30)
        report.section("4. an idle pooled sandbox")
        await backend.pool.wait_ready()
        await backend.drain()
        idle_memory(report, backend)
        report.section("5. replacing the zygote")
        await rotation_cost(report, backend)
    finally:
        await engine.close()
        await served.close()
        await served_in_memory.close()
        await bare_grpc.close()
        floor.close()
        if docker is not None:
            await docker.close()
        if legacy is not None:
            legacy.close()


def uvloop_loop() -> asyncio.AbstractEventLoop:
    import uvloop  # only this process's: ptc serve, spawned from here, picks its own

    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=3, warmup=0)
    parser.add_argument("--per-block", type=int, default=200, help="executions per block")
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="this process's event loop: the embedded engine's and the gRPC client's "
        "(ptc serve picks its own, uvloop unless PTC_EVENT_LOOP says otherwise)",
    )
    parser.add_argument(
        "--legacy-rev", default="6285339^", help="the code before the fork server ('' to skip)"
    )
    parser.add_argument(
        "--docker-per-block",
        type=int,
        default=24,
        help="Docker backend executions per block (0 to skip)",
    )
    args = parser.parse_args()
    with (
        Report("forkserver", args) as report,
        asyncio.Runner(loop_factory=uvloop_loop if args.loop == "uvloop" else None) as runner,
    ):
        runner.run(
            main(
                report,
                args.rounds,
                args.warmup,
                args.per_block,
                args.legacy_rev or None,
                args.docker_per_block,
            )
        )
