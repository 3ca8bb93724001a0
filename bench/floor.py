"""The isolation floor: exactly our process backend's isolation per sandbox, and nothing else.

Run: ``python -m bench.floor [--rounds N] [--warmup N] [--per-block N] [--concurrency C]`` as
root (cgroups, like the process backend). A floor is only a floor for the same work: this one
does, per ``print(1)`` sandbox, every step our process backend does (a cgroup with our limits in
every v1 hierarchy; pid, mount, network, ipc, uts and cgroup namespaces; a tmpfs `/tmp` and
`/dev/shm`; its own `/proc`; `lo` up; rlimits; the uid dropped to nobody; every capability
dropped; no_new_privs and our seccomp program; our guest bootstrap and its protocol), with the
host and the zygote in one process and one poll loop (`bench/floor_zygote.py`). Each step can be
switched off, so that this benchmark prints what each one costs: in interleaved blocks, every
block runs all steps, all steps but one (for each step, with the steps that need it), and none
(fork, print, exit); a step's cost is the median over blocks of the paired difference of CPU
per execution (the floor process's own, host and zygote, plus its sandboxes'; and the
machine's, from /proc/stat, which also counts the kernel threads that tear namespaces down).

`bench.forkserver` runs the whole floor beside our embedded engine and ``ptc serve``; the CPU
per execution by process comes from here (`Floor.block`, `kernel_threads_cpu_s`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import subprocess
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from bench.harness import Report, bench_parser, interleave, percentile
from sandbox.backends.process.backend import default_guest_python
from sandbox.backends.process.cgroups.discovery import find_v1, find_v2
from sandbox.backends.process.seccomp import filter_program
from sandbox.engine import EngineConfig
from sandbox.guest import GUEST_DIR
from sandbox.limits import DEFAULTS
from stubs_gen import load_manifest, render_module

__all__ = [
    "STEPS",
    "Floor",
    "busy_cpu_s",
    "kernel_threads_cpu_s",
    "sandbox_cgroups_cpu_s",
    "steps_without",
]

ROOT = Path(__file__).resolve().parent.parent
STEPS = (
    "cgroup", "pidns", "mntns", "netns", "ipcns", "utsns", "cgroupns", "tmpfs", "proc", "lo",
    "rlimits", "uid", "caps", "seccomp", "bootstrap",
)  # fmt: skip
# A step that cannot be taken without another: switching that one off switches these off too.
NEEDS = {"tmpfs": ("mntns",), "proc": ("mntns", "pidns"), "lo": ("netns",)}
TICKS = os.sysconf("SC_CLK_TCK")


def steps_without(step: str) -> frozenset[str]:
    """Every step but ``step`` and those that need it."""
    return frozenset(s for s in STEPS if s != step and step not in NEEDS.get(s, ()))


def busy_cpu_s() -> float:
    """Machine-wide CPU seconds spent so far (user+nice+system+irq+softirq+steal)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / TICKS


def sandbox_cgroups_cpu_s(pid: int) -> float:
    """CPU seconds charged so far to the sandboxes of process ``pid``'s process backends, by
    their parent cgroups (``ptc-<pid>-<n>`` beside one another in the cgroup of this process,
    which ``pid`` must share: this process or one it started).

    The kernel charges a sandbox's CPU to every ancestor of its cgroup as it runs, and a parent
    keeps it after the sandbox's own cgroup is gone: so this counts each sandbox from joining its
    cgroup to its last process's exit, teardown included, as the floor's own sandbox figures do.
    A result's usage is read before pid 1's exit and misses that teardown (0.2-0.25 ms of a
    `print(1)`)."""
    hierarchies, why_not_v1 = find_v1()
    unified, why_not_v2 = (None, "") if hierarchies else find_v2()
    if hierarchies:
        base = next(h.base for h in hierarchies if "cpuacct" in h.controllers)
    elif unified is not None:
        base = unified.base
    else:
        raise RuntimeError(f"no cgroups to read: {why_not_v1}; {why_not_v2}")
    parents = sorted(base.glob(f"ptc-{pid}-*"))
    if not parents:
        raise RuntimeError(f"process {pid} has no sandbox cgroups under {base}")
    if hierarchies:
        return sum(int((p / "cpuacct.usage").read_text()) for p in parents) / 1e9
    total_us = 0
    for parent in parents:
        for line in (parent / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                total_us += int(value)
    return total_us / 1e6


def kernel_threads_cpu_s() -> float:
    """CPU seconds of the kernel's own threads alive now (kthreadd and its children): where
    network namespaces are torn down and RCU callbacks run. Interrupts are not in it."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if entry.name == "2" or fields[1] == b"2":
            total += int(fields[11]) + int(fields[12])
    return total / TICKS


def _config(parent: str) -> dict[str, object]:
    """What the floor's sandboxes are given: our defaults, as our engine would give them."""
    hierarchies, reason = find_v1()
    if not hierarchies:
        raise SystemExit(f"the floor needs cgroup v1 (as this machine's backend): {reason}")
    cgroups: dict[str, str] = {}
    for hierarchy in hierarchies:
        directory = hierarchy.base / parent
        directory.mkdir(exist_ok=True)
        for controller in hierarchy.controllers:
            cgroups[controller] = str(directory)
    limits = DEFAULTS
    max_call_bytes = EngineConfig().max_call_bytes
    return {
        "cgroups": cgroups,
        "prefix": "s",
        "memory_bytes": limits.memory_bytes,
        "processes": limits.processes,
        "tmp_bytes": limits.file_size_bytes,
        # As `sandbox.execution.drive.job_frame` sends them to a sandbox with a cgroup.
        "rlimits": {
            "cpu_s": math.ceil(limits.cpu_time_ms / 1000) + 1,
            "fsize_bytes": limits.file_size_bytes,
            "nofile": limits.open_files,
            "core_bytes": 0,
        },
        "max_call_bytes": max_call_bytes,
        "outputs": {
            "files": limits.output_files,
            "file_bytes": limits.output_file_bytes,
            "bytes": limits.output_bytes,
            "frame_bytes": max_call_bytes,
        },
        "stubs": render_module(load_manifest([])),
        "steps": list(STEPS),
    }


class Floor:
    """The floor's process (`bench/floor_zygote.py`), asked for blocks of executions."""

    def __init__(self) -> None:
        self.parent = f"ptc-floor-{os.getpid()}"
        config = _config(self.parent)
        self._dirs = sorted(set(str(v) for v in config["cgroups"].values()))  # type: ignore[attr-defined]
        seccomp = tempfile.NamedTemporaryFile(prefix="ptc-floor-seccomp-", delete=False)  # noqa: SIM115
        with seccomp:
            seccomp.write(filter_program())
        self._seccomp = seccomp.name
        config["seccomp_file"] = seccomp.name
        self.proc = subprocess.Popen(
            [
                default_guest_python(), "-I", "-S", "-B", str(ROOT / "bench" / "floor_zygote.py"),
                str(GUEST_DIR), json.dumps(config),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self.close()
            raise SystemExit("the floor's process did not start")

    def run(
        self,
        total: int,
        concurrency: int,
        steps: Iterable[str],
        script: str = "print(1)",
        expect: str = "1\n",
    ) -> dict[str, float]:
        """One block in the floor's process: its rate and its own accounting (seconds). Every
        sandbox must exit 0 having printed ``expect``, else RuntimeError says what it did."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        request = {
            "total": total,
            "concurrency": concurrency,
            "steps": sorted(steps),
            "script": script,
            "expect": expect,
        }
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the floor's process ended (status {self.proc.wait()})")
        reply: dict[str, float] = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"the floor's block failed: {reply['error']}")
        return reply

    def block(self, total: int, concurrency: int, steps: Iterable[str]) -> dict[str, float]:
        """One block: executions/s and CPU per execution (ms) by process, with the machine's."""
        machine, kernel = busy_cpu_s(), kernel_threads_cpu_s()
        own = self.run(total, concurrency, steps)
        kernel = kernel_threads_cpu_s() - kernel
        machine = busy_cpu_s() - machine
        per = 1e3 / total
        host = own["host_zygote_s"]
        sandboxes = own["sandboxes_s"]
        return {
            "executions/s": own["rate"],
            "machine CPU": machine * per,
            "host and zygote (one process)": host * per,
            "sandboxes (fork to exit)": sandboxes * per,
            # What the engine's figure counts (from the move into the cgroup on), so the two
            # compare like for like; 0 without the cgroup step.
            "sandboxes (their cgroups)": own["sandboxes_cgroup_s"] * per,
            "kernel threads": kernel * per,
            "rest (interrupts, other load)": (machine - host - sandboxes - kernel) * per,
            "own CPU (host, zygote, sandboxes)": (host + sandboxes) * per,
            "sandbox minor faults": own["sandbox_minflt"] / total,
        }

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        for directory in self._dirs:
            with contextlib.suppress(OSError):
                os.rmdir(directory)
        with contextlib.suppress(OSError):
            os.unlink(self._seccomp)


async def main(report: Report, rounds: int, warmup: int, per_block: int, concurrency: int) -> None:
    floor = Floor()
    try:
        cases: dict[str, frozenset[str]] = {"all steps": frozenset(STEPS)}
        for step in STEPS:
            cases[f"without {step}"] = steps_without(step)
        cases["none (fork, print, exit)"] = frozenset()
        breakdowns: dict[str, list[dict[str, float]]] = {name: [] for name in cases}

        def case(name: str) -> Callable[[], Awaitable[float]]:
            async def one() -> float:
                figures = await asyncio.to_thread(floor.block, per_block, concurrency, cases[name])
                breakdowns[name].append(figures)
                return figures["executions/s"]

            return one

        await interleave({name: case(name) for name in cases}, rounds, warmup=warmup)
        timed = {name: values[warmup:] for name, values in breakdowns.items()}
        report.section(
            f"1. the isolation floor, print(1) at concurrency {concurrency}: medians of {rounds} "
            f"blocks of {per_block}, per execution"
        )
        full = timed["all steps"]
        for name in full[0]:
            values = [b[name] for b in full]
            unit = "" if name in ("executions/s", "sandbox minor faults") else "ms"
            report.figure(name, percentile(values, 0.5), unit, fmt=".2f")
            report.data(f"{name} samples", values)
        report.section(
            "2. what each step costs: all steps against all but that one (and the steps that "
            "need it), paired by block; CPU ms per execution (own: host, zygote, sandboxes; "
            "machine: everything)"
        )
        for name in cases:
            if name == "all steps":
                continue
            without = timed[name]
            own = [
                f["own CPU (host, zygote, sandboxes)"] - w["own CPU (host, zygote, sandboxes)"]
                for f, w in zip(full, without, strict=True)
            ]
            machine = [
                f["machine CPU"] - w["machine CPU"] for f, w in zip(full, without, strict=True)
            ]
            kernel = [
                f["kernel threads"] - w["kernel threads"]
                for f, w in zip(full, without, strict=True)
            ]
            faults = [
                f["sandbox minor faults"] - w["sandbox minor faults"]
                for f, w in zip(full, without, strict=True)
            ]
            rate = percentile([w["executions/s"] for w in without], 0.5)
            label = name.removeprefix("without ")
            if name.startswith("without"):
                off = sorted(set(STEPS) - steps_without(label) - {label})
                label += f" (+{', '.join(off)})" if off else ""
            else:
                label = "all (against none)"
            report.figure(
                label,
                percentile(own, 0.5),
                "ms own",
                note=(
                    f"kernel threads {percentile(kernel, 0.5):+.2f} ms, "
                    f"machine {percentile(machine, 0.5):+.2f} ms, faults "
                    f"{percentile(faults, 0.5):+.0f}, {rate:.0f}/s without it"
                ),
            )
            report.data(f"{label} own samples", own)
            report.data(f"{label} machine samples", machine)
            report.data(f"{label} kernel threads samples", kernel)
    finally:
        floor.close()


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=5, warmup=1)
    parser.add_argument("--per-block", type=int, default=200, help="executions per block")
    parser.add_argument("--concurrency", type=int, default=4, help="sandboxes at once")
    args = parser.parse_args()
    with Report("floor", args) as report:
        asyncio.run(main(report, args.rounds, args.warmup, args.per_block, args.concurrency))
