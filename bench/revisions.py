"""One benchmark, two revisions, interleaved: is this checkout slower than an older one?

Run: ``python -m bench.revisions --other DIR [--blocks N] MODULE [-- ARGS...]``, e.g.::

    git worktree add /tmp/before <rev>
    python -m bench.revisions --other /tmp/before --blocks 3 bench.grpc -- --rounds 30
    git worktree remove /tmp/before

``DIR`` is a checkout of the other revision (a `git worktree`); it needs no venv of its own when
its dependencies are this one's: each run is ``python -m MODULE ARGS --json-out F`` started in
its checkout with ``PYTHONPATH`` naming it, so the code (``sandbox``, ``bench``, and the ``ptc
serve`` or guest processes they start) is that checkout's, the interpreter and libraries this
venv's. The whole benchmark is the unit: a block runs it once in each checkout, in an order
rotated from block to block (`bench.harness.interleave_sync`), so that a drift of the machine's
load hits both alike, as the benchmark itself does between its own cases.

A benchmark that changed between the two revisions reports other figures under other labels:
``--this-bench`` runs this checkout's ``bench/`` on both sides (copied over the other
checkout's), so that the same benchmark measures two revisions of the code under it.

Printed (and kept in this run's record): for every figure both runs report (a timing's p50, a
rate, a ratio; keyed by section and label), the median over the blocks in each checkout and
``this / other``, with the range of that ratio block by block (each block's two runs ran back to
back). A benchmark's own ratios against its in-run baselines (the floor, a bare RPC)
are the figures least disturbed by the load: compare those first.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness import Report, interleave_sync

ROOT = Path(__file__).resolve().parent.parent

Runs = list[dict[tuple[str, str], tuple[float, str]]]  # one side's figures, a block each


def _git(checkout: Path, *args: str) -> str:
    """What ``git args`` prints in ``checkout``, stripped ("" when it fails)."""
    done = subprocess.run(
        ["git", *args], cwd=checkout, capture_output=True, text=True, check=False, timeout=10
    )
    return done.stdout.strip()


def _revision(checkout: Path) -> str:
    revision = _git(checkout, "rev-parse", "--short", "HEAD") or str(checkout)
    # Uncommitted changes are another revision of the code (and, unmarked, the same name as
    # the commit checked out beside it: one side's runs would be taken for the other's).
    changed = _git(checkout, "status", "--porcelain", "--untracked-files=no")
    return f"{revision}+changes" if changed else revision


def figures(record: dict[str, Any]) -> dict[tuple[str, str], tuple[float, str]]:
    """A benchmark record's numbers by (section, label): a timing's p50 in seconds ("p50",
    lower is better) or a figure's value in its own unit (a rate, a ratio, a count)."""
    found: dict[tuple[str, str], tuple[float, str]] = {}
    for section in record["sections"]:
        for entry in section["figures"]:
            if "label" not in entry:
                continue
            key = (section["title"], entry["label"])
            if "p50" in entry:
                found[key] = (float(entry["p50"]), "p50 s")
            elif isinstance(entry.get("value"), int | float):
                found[key] = (float(entry["value"]), str(entry.get("unit", "")))
    return found


def _runner(
    checkout: Path, module: str, args: list[str], out: Path, records: Runs
) -> Callable[[], None]:
    def run() -> None:
        target = out / f"{checkout.name}-{len(records)}.json"
        print(f"-- {module} in {checkout} ({_revision(checkout)})", flush=True)
        subprocess.run(
            [sys.executable, "-m", module, *args, "--json-out", str(target)],
            cwd=checkout,
            env={**os.environ, "PYTHONPATH": str(checkout)},
            check=True,
        )
        records.append(figures(json.loads(target.read_text())))

    return run


def compare(report: Report, names: tuple[str, str], runs: tuple[Runs, Runs]) -> None:
    """Median over the blocks of each figure both sides reported, and this / other."""
    this, other = runs
    keys = [k for k in this[0] if all(k in r for r in (*this, *other))]
    report.section(f"this ({names[0]}) / other ({names[1]}), medians over {len(this)} blocks")
    title = None
    for key in keys:
        if key[0] != title:
            title = key[0]
            if title:
                report.print(f"  {title}")
        mine = statistics.median(r[key][0] for r in this)
        theirs = statistics.median(r[key][0] for r in other)
        ratio = mine / theirs if theirs else float("nan")
        unit = this[0][key][1]
        # Block by block (the two runs of a block ran back to back): the ratio's spread.
        ratios = [a[key][0] / b[key][0] for a, b in zip(this, other, strict=True) if b[key][0]]
        spread = f"; blocks {min(ratios):.3f}-{max(ratios):.3f}" if ratios else ""
        report.figure(
            key[1], ratio, "x", note=f"{mine:.4g} vs {theirs:.4g} {unit}{spread}", fmt=".3f"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--other", type=Path, required=True, help="the other revision's checkout")
    parser.add_argument("--blocks", type=int, default=3, help="runs of the benchmark per side")
    parser.add_argument(
        "--this-bench",
        action="store_true",
        help="run this checkout's bench/ on both sides (copied over the other checkout's, which "
        "must be a throwaway worktree): the same benchmark code, two revisions of the code it "
        "measures",
    )
    parser.add_argument("--json-out", default=None, help="this comparison's JSON record")
    parser.add_argument("module", help="the benchmark, e.g. bench.grpc")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="after --: the benchmark's own")
    args = parser.parse_args()
    passed = args.args[1:] if args.args[:1] == ["--"] else args.args
    other = args.other.resolve()
    if args.this_bench:
        shutil.copytree(
            ROOT / "bench",
            other / "bench",
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns("results"),
        )
    names = (_revision(ROOT), _revision(other))
    if names[0] == names[1]:
        names = (f"{names[0]} ({ROOT.name})", f"{names[1]} ({other.name})")
    runs: tuple[Runs, Runs] = ([], [])
    with (
        tempfile.TemporaryDirectory(prefix="ptc-bench-revisions-") as tmp,
        Report(f"revisions-{args.module.rsplit('.', 1)[-1]}", args) as report,
    ):
        out = Path(tmp)
        interleave_sync(
            {
                names[0]: _runner(ROOT, args.module, passed, out, runs[0]),
                names[1]: _runner(other, args.module, passed, out, runs[1]),
            },
            args.blocks,
            warmup=0,
        )
        compare(report, names, runs)


if __name__ == "__main__":
    main()
