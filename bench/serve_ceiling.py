"""The served ceiling: the isolation floor plus what any served execution must pay, and no more.

Issue 40's acceptance, printed by `bench.forkserver` from the blocks of one run: a served
execution must pay its isolation (the floor), one gRPC call of its sizes (a bare echo,
`bench.grpc_echo`, client and server CPU together) and two durable commits (the admission before
it runs, the completion before the reply: `durable_commits`). Its ceiling against the floor is
``floor / (floor + echo + commits)``; ``ptc serve`` is judged by how close its rate comes to it.
A back-to-back echo shares its wake-ups with the next call, which a served execution, one every
few milliseconds per slot, does not: a second line puts in the call paced as served executions
are (`bench.grpc_floor`, when the run has its blocks), which costs about twice as much.
The floor, the engine and ``ptc serve`` are compared by their own CPU per execution (the
machine's less the rest: on a shared machine other load moves the machine's by milliseconds).

`durable_commits` is SQLite as the audit store opens it (WAL, ``synchronous=FULL``), one 1.5 KB
row inserted in a transaction and then rewritten in a second, per execution: what the two
promises cost by themselves, without the audit's own Python, its hash chain or its indexes
(beside it, the same with ``synchronous=NORMAL``, the audit store's default, which fsyncs only
at checkpoints: about a quarter of FULL's CPU). Its
figure is the CPU of the thread that commits (``fsync`` included, as system time) and not the
kernel's journal threads (`bench.floor.kernel_threads_cpu_s` counts those, for every way alike).
"""

from __future__ import annotations

import sqlite3
import tempfile
import time

from bench.harness import Report, percentile

__all__ = [
    "COMMITS",
    "ECHO_AIO",
    "ECHO_THREADS",
    "PACED",
    "REST",
    "DurableCommits",
    "print_ceiling",
]

ROW_BYTES = 1500
SYNCHRONOUS = ("FULL", "NORMAL")  # the two a caller may ask for
ECHO_THREADS = "reference: bare gRPC echo, thread-pool server c=4"
ECHO_AIO = "reference: bare gRPC echo, grpc.aio on uvloop c=4"
COMMITS = "reference: two durable SQLite commits"
COMMITS_NORMAL = "reference: two SQLite commits, synchronous=NORMAL"
PACED = "reference: bare gRPC unary c=4"  # bench.forkserver's name for bench.grpc_floor's blocks
FLOOR = "isolation floor c={c}"
ENGINE = "embedded engine c={c}"
SERVED = "ptc serve + gRPC c={c}"
TARGET = 0.85


class DurableCommits:
    """A SQLite file in WAL mode, in a temporary directory of its own, committing with
    ``synchronous`` FULL (issue 40's: an fsync per commit, durable through a power loss) or
    NORMAL (what the audit store does by default: durable through any crash of the process, its
    contract's crash model, with no fsync per commit; `sandbox.audit.sqlite`)."""

    def __init__(self, synchronous: str = "FULL") -> None:
        if synchronous not in SYNCHRONOUS:
            raise ValueError(f"synchronous: {synchronous!r} is neither of {sorted(SYNCHRONOUS)}")
        self.dir = tempfile.TemporaryDirectory(prefix="ptc-bench-commits-")
        # isolation_level=None: transactions are the explicit BEGIN/COMMIT below; blocks run in
        # worker threads, one at a time.
        self.db = sqlite3.connect(
            f"{self.dir.name}/commits.db", isolation_level=None, check_same_thread=False
        )
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.db.execute("CREATE TABLE records (id TEXT PRIMARY KEY, status TEXT, body TEXT)")
        self.row = 0

    def block(self, executions: int) -> dict[str, float]:
        """CPU per execution (ms) of this thread for ``executions`` admissions and completions,
        each committed on its own; run in a worker thread (its clock is the thread's)."""
        body = "x" * ROW_BYTES
        started, cpu = time.perf_counter(), time.thread_time()
        for _ in range(executions):
            self.row += 1
            key = f"{self.row:032x}"
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute("INSERT INTO records VALUES (?, 'running', ?)", (key, body))
            self.db.execute("COMMIT")
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute("UPDATE records SET status = 'ok', body = ? WHERE id = ?", (body, key))
            self.db.execute("COMMIT")
        cpu = time.thread_time() - cpu
        return {
            "executions/s": executions / (time.perf_counter() - started),
            "commits": cpu * 1e3 / executions,
        }

    def close(self) -> None:
        self.db.close()
        self.dir.cleanup()


REST = "rest (interrupts, other load)"


FORK_TO_EXIT = "sandboxes (fork to exit)"
CGROUPS = "sandboxes (their cgroups)"


def _own(run: dict[str, float]) -> float:
    """A way's own CPU per execution: the machine's less what no process of it used (other
    engineers' load on a shared machine, interrupts), which moves the machine's by milliseconds.
    Its sandboxes are counted by their cgroups for every way: the floor's figures also have them
    from fork to exit, the engine's cannot (a sandbox's CPU before it joins its cgroup is in the
    engine's rest), so the floor's are counted as the engine's are."""
    own = run["machine CPU"] - run.get(REST, 0.0)
    if FORK_TO_EXIT in run and CGROUPS in run:
        own += run[CGROUPS] - run[FORK_TO_EXIT]
    return own


def _median(blocks: dict[str, list[dict[str, float]]], name: str, label: str) -> float | None:
    runs = blocks.get(name)
    return percentile([run[label] for run in runs], 0.5) if runs else None


def _paced(blocks: dict[str, list[dict[str, float]]]) -> float | None:
    """`bench.grpc_floor`'s bare call, client and server, median of its blocks: a call of the
    same kind whose method waits as long as a served execution takes, so that, as a served
    execution's, it shares no wake-up with the next call (at c=4 on the 2-core machine it costs
    about twice the back-to-back echo)."""
    runs = blocks.get(PACED)
    if not runs:
        return None
    return percentile([run["server process"] + run["client (this process)"] for run in runs], 0.5)


def print_ceiling(report: Report, blocks: dict[str, list[dict[str, float]]]) -> None:
    """The ceiling lines: each part's median over ``blocks`` (`bench.forkserver`'s timed blocks)
    and, per concurrency, the ceiling and how far the engine and ``ptc serve`` are from it, from
    each way's own CPU per execution (its processes, its sandboxes' cgroups and the kernel's
    threads; `_own`), block by block: steadier than the rates on a shared machine."""
    echo = _median(blocks, ECHO_THREADS, "echo")
    commits = _median(blocks, COMMITS, "commits")
    if echo is None or commits is None:
        return
    for name in (ECHO_THREADS, ECHO_AIO):
        runs = blocks.get(name)
        if runs:
            parts = {k: percentile([r[k] for r in runs], 0.5) for k in ("client", "server", "echo")}
            report.figure(
                f"{name.removeprefix('reference: ')}: CPU per call",
                parts["echo"],
                "ms",
                note=f"client {parts['client']:.3f} + server {parts['server']:.3f}, "
                "1.5 KB each way, back to back",
                fmt=".3f",
            )
    paced = _paced(blocks)
    if paced is not None:
        report.figure(
            "the same call paced as served executions are: CPU per call",
            paced,
            "ms",
            note="bench.grpc_floor's bare call, client and server",
            fmt=".3f",
        )
    report.figure("two durable commits (WAL, synchronous=FULL): CPU", commits, "ms", fmt=".3f")
    normal = _median(blocks, COMMITS_NORMAL, "commits")
    if normal is not None:
        report.figure(
            "the same with synchronous=NORMAL: CPU",
            normal,
            "ms",
            note="ptc serve's SQLite audit's default (durable through a crash of the process)",
            fmt=".3f",
        )
    for c in (4, 32):
        floor_runs = blocks.get(FLOOR.format(c=c), [])
        if not floor_runs:
            continue
        floors = [_own(run) for run in floor_runs]
        floor = percentile(floors, 0.5)
        ceiling = floor / (floor + echo + commits)
        report.figure(f"isolation floor c={c}: own CPU per execution", floor, "ms")
        for way in (ENGINE, SERVED):
            runs = blocks.get(way.format(c=c), [])
            if runs:
                cpu = percentile([_own(run) for run in runs], 0.5)
                ratios = [f / _own(r) for f, r in zip(floors, runs, strict=True)]
                report.figure(
                    f"{way.format(c=c)}: own CPU per execution",
                    cpu,
                    "ms",
                    note=f"floor / it {percentile(ratios, 0.5):.2f}x (blocks "
                    f"{min(ratios):.2f}-{max(ratios):.2f})",
                )
        report.figure(
            f"served ceiling c={c}: floor / (floor + echo + commits)",
            ceiling,
            "x",
            note=f"ptc serve's target {TARGET:.2f}x is {TARGET / ceiling:.2f} of it",
        )
        if paced is not None:
            report.figure(
                f"served ceiling c={c} with the call paced: floor / (floor + paced + commits)",
                floor / (floor + paced + commits),
                "x",
            )
