"""One harness for every benchmark: percentiles, interleaved blocks with warm-up, a JSON record.

The machines are shared and noisy, so a figure means something only next to its baseline
measured in the same run, under the same load. The harness therefore runs the things compared
*interleaved*: after a warm-up of each (discarded), every block runs each case once, in an
order rotated from block to block, so a slow drift of the machine's load hits all cases alike.
Every printed figure also goes to a JSON record of the run (``bench/results/<name>-<UTC
time>.json``, or ``--json-out PATH``), with the arguments, the host and the git revision.

How to write a benchmark (``bench/example.py``, run as ``python -m bench.example``)::

    from bench.harness import Report, bench_parser, interleave

    async def main(report: Report, rounds: int, warmup: int) -> None:
        engine = ...
        report.section("1. print(1), end to end")
        times = await interleave(
            {"ours": lambda: engine.execute(request), "baseline": run_baseline},
            rounds,
            warmup=warmup,
            before=pool.wait_ready,  # awaited before every run, warm-up and timed, untimed
        )
        for label, values in times.items():
            report.timings(label, values)  # p50/p95 in ms, samples kept in the record
        report.figure("ratio p50", percentile(times["ours"], 0.5) / percentile(..., 0.5), "x",
                      note="target < 1")

    if __name__ == "__main__":
        args = bench_parser(__doc__, rounds=40).parse_args()
        with Report("example", args) as report:
            asyncio.run(main(report, args.rounds, args.warmup))

A case is a callable (plain or returning an awaitable); its sample is the wall time of the call,
or the number it returns when it times itself (a script that reports its own timing, a rate).
``block=K`` runs each case K times in a row per block, for figures that mean "back to back".
`interleave_sync` is the same for blocking cases. Keep default round counts such that a run takes
seconds to a few minutes: every benchmark must also run with ``--rounds 3`` as a smoke test.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import inspect
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = [
    "RESULTS_DIR",
    "Report",
    "bench_parser",
    "interleave",
    "interleave_sync",
    "percentile",
    "rate_in_slots",
    "run_in_slots",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"

# A case of `interleave`: a plain callable, or one returning an awaitable (then awaited).
AsyncCase = Callable[[], Awaitable[Any] | Any]
SyncCase = Callable[[], Any]


def percentile(values: Iterable[float], q: float) -> float:
    """The nearest-rank ``q`` quantile: the smallest sample with at least ``q`` of all samples
    at or below it, so always a sample, never an interpolation. 0.5 is the median of an odd
    count and the lower of the two middle samples of an even one; 0.95 of 20 samples is the
    19th smallest; 0 is the minimum and 1 the maximum."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no samples")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"a quantile is between 0 and 1, not {q}")
    # The rank is ceil(q * n); the tolerance keeps 0.1 * 30 (3.0000000000000004) at rank 3.
    rank = math.ceil(q * len(ordered) - 1e-9)
    return ordered[max(rank, 1) - 1]


async def run_in_slots(one: Callable[[], Awaitable[None]], total: int, concurrency: int) -> None:
    """Runs ``one`` ``total`` times, ``concurrency`` at a time: that many loops, each starting
    the next run when its last one ended. No task and no semaphore wait per run: those cost the
    driver ~0.1 ms of loop CPU per execution, which a measurement of the engine would count as
    the engine's (the floor's driver, a poll loop, has none)."""
    remaining = total

    async def slot() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await one()

    await asyncio.gather(*(slot() for _ in range(min(concurrency, total))))


async def rate_in_slots(one: Callable[[], Awaitable[None]], total: int, concurrency: int) -> float:
    """`run_in_slots`, timed: runs per second over the whole block."""
    started = asyncio.get_running_loop().time()
    await run_in_slots(one, total, concurrency)
    return total / (asyncio.get_running_loop().time() - started)


def _order(names: list[str], block: int) -> list[str]:
    return [names[(block + k) % len(names)] for k in range(len(names))]


def _sample(started: float, returned: Any) -> float:
    if isinstance(returned, (int, float)) and not isinstance(returned, bool):
        return float(returned)
    return time.perf_counter() - started


async def interleave(
    cases: Mapping[str, AsyncCase],
    rounds: int,
    *,
    warmup: int = 1,
    block: int = 1,
    before: Callable[[], Awaitable[Any]] | None = None,
) -> dict[str, list[float]]:
    """``rounds`` blocks of every case, rotated, after ``warmup`` discarded blocks.

    In a block each case runs ``block`` times in a row (a sample each): more than one where a
    figure means "back to back". ``before`` is awaited, untimed, before every run (a pool
    refill, a pause). A case's sample is its wall time, or the number it returns.
    """
    names = list(cases)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for index in range(warmup + rounds):
        for name in _order(names, index):
            for _ in range(block):
                if before is not None:
                    await before()
                started = time.perf_counter()
                returned = cases[name]()
                if inspect.isawaitable(returned):
                    returned = await returned
                if index >= warmup:
                    samples[name].append(_sample(started, returned))
    return samples


def interleave_sync(
    cases: Mapping[str, SyncCase],
    rounds: int,
    *,
    warmup: int = 1,
    block: int = 1,
    before: Callable[[], Any] | None = None,
) -> dict[str, list[float]]:
    """`interleave` for blocking cases."""
    names = list(cases)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for index in range(warmup + rounds):
        for name in _order(names, index):
            for _ in range(block):
                if before is not None:
                    before()
                started = time.perf_counter()
                returned = cases[name]()
                if index >= warmup:
                    samples[name].append(_sample(started, returned))
    return samples


_SCALES = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}


class Report:
    """Prints a benchmark's table and keeps every figure for the JSON record of the run."""

    def __init__(self, name: str, args: argparse.Namespace | None = None) -> None:
        self.name = name
        self.args = args
        self.started = dt.datetime.now(dt.UTC)
        self._sections: list[dict[str, Any]] = []
        self._section("")
        json_out = getattr(args, "json_out", None)
        stamp = self.started.strftime("%Y%m%dT%H%M%SZ")
        self.path = Path(json_out) if json_out else RESULTS_DIR / f"{name}-{stamp}.json"
        self.print(
            f"{name}: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, "
            f"{stamp}, git {_git_revision()}"
        )

    def _section(self, title: str) -> None:
        self._sections.append({"title": title, "figures": []})

    def _add(self, entry: dict[str, Any]) -> None:
        self._sections[-1]["figures"].append(entry)

    # -- what a benchmark reports -------------------------------------------------------------
    def print(self, text: str = "") -> None:
        """A line of the table that is no figure (kept in the record as a note)."""
        print(text, flush=True)
        if text:
            self._add({"note": text})

    def section(self, title: str) -> None:
        print(title, flush=True)
        self._section(title)

    def timings(self, label: str, seconds: list[float], unit: str = "ms", note: str = "") -> None:
        """Samples in seconds: printed as p50/p95 in ``unit``, all kept in the record."""
        scale = _SCALES[unit]
        p50, p95 = percentile(seconds, 0.5), percentile(seconds, 0.95)
        print(
            f"   {label:<40} p50 {p50 * scale:9.2f} {unit}  p95 {p95 * scale:9.2f} {unit}"
            f"  (n={len(seconds)}){note}",
            flush=True,
        )
        self._add(
            {
                "label": label,
                "unit": "s",
                "p50": p50,
                "p95": p95,
                "mean": statistics.fmean(seconds),
                "n": len(seconds),
                "samples": seconds,
                "note": note.strip(),
            }
        )

    def figure(self, label: str, value: float, unit: str, note: str = "", fmt: str = ".2f") -> None:
        """One number (a ratio, a rate, a count) with its unit."""
        print(
            f"   {label:<40} {value:{fmt}} {unit}{'  (' + note + ')' if note else ''}", flush=True
        )
        self._add({"label": label, "value": value, "unit": unit, "note": note})

    def data(self, label: str, value: Any) -> None:
        """Anything JSON can hold, kept in the record only (a table printed with `print`)."""
        self._add({"label": label, "data": value})

    # -- the record ---------------------------------------------------------------------------
    def record(self) -> dict[str, Any]:
        return {
            "bench": self.name,
            "started_at": self.started.isoformat(),
            "finished_at": dt.datetime.now(dt.UTC).isoformat(),
            "argv": sys.argv,
            "args": {k: v for k, v in vars(self.args or argparse.Namespace()).items()},
            "host": {
                "cpus": os.cpu_count(),
                "load": os.getloadavg(),
                "python": platform.python_version(),
                "platform": platform.platform(),
            },
            "git": _git_revision(),
            "sections": [s for s in self._sections if s["title"] or s["figures"]],
        }

    def write(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.record(), indent=1, default=str) + "\n")
        print(f"record: {self.path}", flush=True)
        return self.path

    def __enter__(self) -> Report:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            self.write()


def bench_parser(doc: str | None, *, rounds: int, warmup: int = 1) -> argparse.ArgumentParser:
    """The options every benchmark has: ``--rounds``, ``--warmup``, ``--json-out``."""
    parser = argparse.ArgumentParser(
        description=(doc or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=rounds, help="timed blocks per comparison")
    parser.add_argument("--warmup", type=int, default=warmup, help="discarded blocks first")
    parser.add_argument(
        "--json-out", default=None, help=f"the run's JSON record (default {RESULTS_DIR}/...)"
    )
    return parser


def _git_revision() -> str:
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent,
            check=False,
            timeout=5,
        )
    except OSError:
        return "unknown"
    return proc.stdout.strip() or "unknown"
