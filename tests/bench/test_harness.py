"""The bench harness (`bench/harness.py`): its nearest-rank percentile, the rotated order of
interleaved blocks with the warm-up dropped, and the JSON record written beside the table.

No benchmark runs here: each case below is a plain function that reports its own sample, so what
the harness kept and in which order it ran them is exact.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench.harness import (
    Report,
    bench_parser,
    interleave,
    interleave_sync,
    percentile,
    run_in_slots,
)

# (samples, q, the nearest-rank answer): the smallest sample with at least q of them at or below
PERCENTILES = {
    "odd-median": ([3.0, 1.0, 2.0], 0.5, 2.0),
    "one-sample": ([7.0], 0.5, 7.0),
    "one-sample-p95": ([7.0], 0.95, 7.0),
    "two-median-is-the-lower": ([2.0, 1.0], 0.5, 1.0),
    "four-median-is-the-lower": ([4.0, 1.0, 3.0, 2.0], 0.5, 2.0),
    "six-median-is-the-lower": ([6.0, 5.0, 4.0, 3.0, 2.0, 1.0], 0.5, 3.0),
    "eight-median-is-the-lower": ([float(v) for v in range(8, 0, -1)], 0.5, 4.0),
    "p95-of-20-is-the-19th": ([float(v) for v in range(1, 21)], 0.95, 19.0),
    "p95-of-100-is-the-95th": ([float(v) for v in range(100, 0, -1)], 0.95, 95.0),
    "p95-of-10-is-the-max": ([float(v) for v in range(1, 11)], 0.95, 10.0),
    "q0-is-the-min": ([5.0, 2.0, 9.0], 0.0, 2.0),
    "q1-is-the-max": ([5.0, 2.0, 9.0], 1.0, 9.0),
    "float-rounding-0.1-of-30": ([float(v) for v in range(1, 31)], 0.1, 3.0),
    "ties": ([1.0, 1.0, 2.0, 2.0], 0.5, 1.0),
    "negative": ([-3.0, -1.0, -2.0], 0.5, -2.0),
}


@pytest.mark.parametrize("name", list(PERCENTILES))
def test_percentile_is_nearest_rank(name: str) -> None:
    values, q, expected = PERCENTILES[name]
    before = list(values)
    assert percentile(values, q) == expected
    assert values == before  # sorted a copy
    # Nearest rank is always one of the samples, never an interpolation between two.
    assert percentile(values, q) in values
    assert percentile(iter(values), q) == expected  # any iterable, a generator included


def test_percentile_matches_the_definition_for_every_count() -> None:
    for n in range(1, 41):
        values = [float(v) for v in range(n, 0, -1)]  # 1..n, reversed
        for q in (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99):
            # The q * n-th smallest, rounded up: here the value is its own rank.
            rank = next(r for r in range(1, n + 1) if r >= q * n - 1e-9)
            assert percentile(values, q) == float(rank), (n, q)
        assert percentile(values, 0.5) == float(math.ceil(n / 2))


@pytest.mark.parametrize(
    ("values", "q", "message"),
    [([], 0.5, "no samples"), ([1.0], -0.1, "between 0 and 1"), ([1.0], 1.5, "between 0 and 1")],
    ids=["empty", "below-0", "above-1"],
)
def test_percentile_refuses_what_has_no_answer(values: list[float], q: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        percentile(values, q)


class Recorder:
    """Cases that log each run (case, run number) and return the run number as their sample."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.befores = 0

    def case(self, name: str) -> Any:
        def run() -> float:
            self.runs.append(name)
            return float(len(self.runs))

        return run

    def before(self) -> None:
        self.befores += 1


def test_interleave_rotates_the_order_and_drops_the_warmup() -> None:
    rec = Recorder()

    async def before() -> None:
        rec.before()

    def async_case(name: str) -> Any:
        sync = rec.case(name)

        async def run() -> float:
            await asyncio.sleep(0)
            return float(sync())

        return run

    samples = asyncio.run(interleave({n: async_case(n) for n in "abc"}, 3, warmup=2, before=before))
    # Block k starts at case k mod 3: two warm-up blocks, then three timed ones.
    assert rec.runs == list("abcbcacababcbca")
    assert rec.befores == 15
    # Each case's samples are its runs of the timed blocks only (runs 7..15), in block order.
    assert samples == {"a": [8.0, 10.0, 15.0], "b": [9.0, 11.0, 13.0], "c": [7.0, 12.0, 14.0]}


def test_interleave_sync_runs_a_block_back_to_back() -> None:
    rec = Recorder()
    samples = interleave_sync(
        {n: rec.case(n) for n in "ab"}, 2, warmup=1, block=2, before=rec.before
    )
    assert rec.runs == list("aabbbbaaaabb")
    assert rec.befores == 12
    assert samples == {"a": [7.0, 8.0, 9.0, 10.0], "b": [5.0, 6.0, 11.0, 12.0]}


def test_interleave_without_warmup_keeps_every_block() -> None:
    rec = Recorder()
    samples = interleave_sync({"only": rec.case("only")}, 3, warmup=0)
    assert samples == {"only": [1.0, 2.0, 3.0]}


def test_a_case_that_returns_no_number_is_timed() -> None:
    # None, and True (a bool is no sample), are not numbers the case measured: its wall time is.
    samples = interleave_sync({"none": lambda: None, "bool": lambda: True}, 2, warmup=0)
    for values in samples.values():
        assert len(values) == 2 and all(0 <= v < 1 for v in values)


def test_the_record_is_written_beside_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "record.json"
    args = bench_parser("A unit test.\n\nMore.", rounds=5).parse_args(
        ["--rounds", "3", "--json-out", str(out)]
    )
    assert (args.rounds, args.warmup, args.json_out) == (3, 1, str(out))
    with Report("unit", args) as report:
        report.section("1. timings")
        report.timings("case", [0.004, 0.001, 0.003, 0.002])
        report.figure("ratio", 1.5, "x", note="target < 2")
        report.print("a plain line")
        report.data("raw", {"k": [1, 2]})
    printed = capsys.readouterr().out.splitlines()
    assert printed[1:] == [
        "1. timings",
        "   case                                     p50      2.00 ms  p95      4.00 ms  (n=4)",
        "   ratio                                    1.50 x  (target < 2)",
        "a plain line",
        f"record: {out}",
    ]
    record = json.loads(out.read_text())
    assert record["bench"] == "unit"
    assert record["args"] == {"rounds": 3, "warmup": 1, "json_out": str(out)}
    assert set(record["host"]) == {"cpus", "load", "python", "platform"}
    header, timings = record["sections"]
    assert header["title"] == "" and header["figures"][0]["note"] == printed[0]
    assert timings["title"] == "1. timings"
    case, ratio, note, raw = timings["figures"]
    assert (case["p50"], case["p95"], case["n"], case["unit"]) == (0.002, 0.004, 4, "s")
    assert case["samples"] == [0.004, 0.001, 0.003, 0.002]
    assert case["mean"] == pytest.approx(0.0025)
    assert ratio == {"label": "ratio", "value": 1.5, "unit": "x", "note": "target < 2"}
    assert note == {"note": "a plain line"}
    assert raw == {"label": "raw", "data": {"k": [1, 2]}}
    assert list(tmp_path.iterdir()) == [out]


def test_a_failed_run_writes_no_record(tmp_path: Path) -> None:
    out = tmp_path / "record.json"
    with pytest.raises(RuntimeError), Report("unit", argparse.Namespace(json_out=str(out))):
        raise RuntimeError("the benchmark failed")
    assert not out.exists()


@pytest.mark.parametrize(("total", "concurrency"), [(10, 4), (3, 8), (0, 4), (32, 32)])
def test_run_in_slots_runs_each_once_and_never_more_at_once(total: int, concurrency: int) -> None:
    running, peak, runs = 0, 0, 0

    async def one() -> None:
        nonlocal running, peak, runs
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.001)
        running -= 1
        runs += 1

    asyncio.run(run_in_slots(one, total, concurrency))
    assert runs == total
    assert peak == min(total, concurrency)
