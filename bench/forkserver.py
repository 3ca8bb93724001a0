"""Fork-server benchmark: what a sandbox costs a shared service, against its floors.

Run: ``python -m bench.forkserver [--rounds N] [--per-block N]`` as root (cgroups, like the
process backend). In interleaved blocks, so that a noisy neighbour hits every way alike:

1. sustained executions/s of ``print(1)`` through the embedded `Engine` (process backend, forked
   sandboxes) at concurrency 4 and 32, with the machine's CPU time per execution (from
   /proc/stat: everything the host, the zygote and the sandboxes spent);
2. the same through the code before the fork server (``--legacy-rev``, default the commit before
   it: a bubblewrap and a fresh interpreter per sandbox), run from a git worktree in a
   subprocess, so "10x what the current code reaches" is measured, not remembered;
3. the bare fork+unshare floor: a parent that has imported the guest runtime's modules forks a
   child that unshares mount, uts, ipc and network namespaces and prints, at concurrency 4;
4. a bare ``bwrap --unshare-all python3 -I -S -c 'print(1)'`` per execution, at concurrency 4;
5. where a Docker engine and the runtime image are there (``PTC_DOCKER_HOST``), the Docker
   backend's sustained rate at concurrency 4 (``--docker-per-block`` executions a block: it keeps
   a single-use container per execution, so the engine's container start is its floor).

Then, once: warm ``print(1)`` p50 beside ``python3 -I -S -c pass``; an idle pooled sandbox's
private memory (USS of its two processes) and cgroup charge; what replacing the zygote costs.
Targets (issue 11): (1) >= 10x (2); (1) at concurrency 4 >= 0.6x (3); idle USS <= 2 MiB;
print(1) p50 <= 0.3x python3 -I -S -c pass.
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

from bench.harness import Report, bench_parser, interleave, percentile
from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig
from sandbox.backends.process.bwrap import bwrap_path
from sandbox.engine import Engine, EngineConfig, ExecutionRequest

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


def busy_cpu_s() -> float:
    """Machine-wide CPU seconds spent so far (user+nice+system+irq+softirq+steal)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def zygote_cpu_s(backend: ProcessBackend) -> float:
    """CPU seconds of the backend's zygotes alive now (their forks and requests)."""
    total = 0.0
    for pid in backend.zygote.pids() if backend.zygote is not None else []:
        with contextlib.suppress(psutil.Error):
            cpu = psutil.Process(pid).cpu_times()
            total += cpu.user + cpu.system
    return total


def own_cpu_s(backend: ProcessBackend) -> float:
    """CPU seconds of this process (every thread: the host side) and of the zygote itself
    (its forks); sandboxes' own CPU comes from their cgroups, in each result."""
    times = os.times()
    return times.user + times.system + zygote_cpu_s(backend)


async def engine_rate(
    engine: Engine, backend: ProcessBackend, total: int, concurrency: int
) -> tuple[float, float, float]:
    """Executions/s; machine CPU per execution (everything on the machine, other load
    included); and CPU per execution of our own processes (host, zygote, sandboxes' cgroups:
    unlike the machine's figure, other load does not inflate it, but work the kernel does in
    its own threads, such as tearing down network namespaces, is not in it)."""
    slots = asyncio.Semaphore(concurrency)
    sandbox_cpu = 0.0

    async def one() -> None:
        nonlocal sandbox_cpu
        async with slots:
            result = await engine.execute(ExecutionRequest("print(1)"))
            assert result.status == "ok" and result.stdout == "1\n", result.to_json()
            sandbox_cpu += result.usage.cpu_time_s

    cpu, own, t = busy_cpu_s(), own_cpu_s(backend), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(total)))
    elapsed, cpu = time.perf_counter() - t, busy_cpu_s() - cpu
    own = own_cpu_s(backend) - own + sandbox_cpu
    return total / elapsed, cpu / total, own / total


async def plain_rate(engine: Engine, total: int, concurrency: int) -> float:
    """Executions/s of print(1) through ``engine`` (its default backend)."""
    slots = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with slots:
            result = await engine.execute(ExecutionRequest("print(1)"))
            assert result.status == "ok" and result.stdout == "1\n", result.to_json()

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(total)))
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
    cpu_per: dict[str, list[float]] = {}
    await engine.start()
    docker = await docker_engine() if docker_per_block else None
    try:
        await backend.pool.wait_ready()
        report.print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
        cases: dict[str, Callable[[], Awaitable[float]]] = {}
        for c in (4, 32):

            async def ours(c: int = c) -> float:
                rate, cpu, own = await engine_rate(engine, backend, per_block, c)
                cpu_per.setdefault(f"ours c={c}: machine CPU", []).append(cpu)
                cpu_per.setdefault(f"ours c={c}: own CPU (host, zygote, sandboxes)", []).append(own)
                return rate

            cases[f"ours c={c}"] = ours
        if legacy is not None:
            for c in (4, 32):

                async def old(c: int = c) -> float:
                    return await asyncio.to_thread(legacy.rate, c)

                cases[f"before the fork server c={c}"] = old

        async def floor() -> float:
            return await asyncio.to_thread(floor_rate, per_block, 4)

        async def bwrap() -> float:
            return await asyncio.to_thread(bwrap_rate, per_block, 4)

        cases["bare fork+unshare c=4"] = floor
        cases["bare bwrap python3 -c c=4"] = bwrap
        if docker is not None:

            async def containers(engine: Engine = docker) -> float:
                return await plain_rate(engine, docker_per_block, 4)

            cases["Docker backend c=4"] = containers
        report.section(
            f"1. sustained executions/s of print(1), {rounds} interleaved blocks of {per_block}"
        )
        rates = await interleave(cases, rounds, warmup=warmup, before=backend.pool.wait_ready)
        med = {name: percentile(values, 0.5) for name, values in rates.items()}
        for name, value in med.items():
            report.figure(name, value, "executions/s", fmt=".1f")
            report.data(f"{name} samples", rates[name])
        for name, values in cpu_per.items():
            # Every block ran each case once, the warm-up blocks first: theirs are not counted.
            timed = values[warmup:]
            report.figure(f"{name} per execution", percentile(timed, 0.5) * 1e3, "ms")
        floor_c4 = med["bare fork+unshare c=4"]
        report.figure(
            "ours c=4 / fork+unshare floor", med["ours c=4"] / floor_c4, "x", note=">= 0.6"
        )
        if legacy is not None:
            for c in (4, 32):
                ratio = med[f"ours c={c}"] / med[f"before the fork server c={c}"]
                report.figure(f"ours / before the fork server, c={c}", ratio, "x", note=">= 10")
        if docker is not None:
            ratio = med["ours c=4"] / med["Docker backend c=4"]
            report.figure("ours / Docker backend, c=4", ratio, "x")
        report.section("2. warm print(1) latency")
        await latency(report, engine, backend, 30)
        report.section("3. an idle pooled sandbox")
        await backend.pool.wait_ready()
        await backend.drain()
        idle_memory(report, backend)
        report.section("4. replacing the zygote")
        await rotation_cost(report, backend)
    finally:
        await engine.close()
        if docker is not None:
            await docker.close()
        if legacy is not None:
            legacy.close()


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=3, warmup=0)
    parser.add_argument("--per-block", type=int, default=200, help="executions per block")
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
    with Report("forkserver", args) as report:
        asyncio.run(
            main(
                report,
                args.rounds,
                args.warmup,
                args.per_block,
                args.legacy_rev or None,
                args.docker_per_block,
            )
        )
