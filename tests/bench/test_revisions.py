"""The two-revision driver (`bench/revisions.py`): which numbers of a benchmark's record it
compares, and the median per side and ratio it reports. No benchmark runs here: the records are
made with the harness's own `Report`, as a benchmark makes them."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest

from bench.harness import Report
from bench.revisions import _revision, compare, figures


def _record(tmp_path: Path, p50_s: float, rate: float) -> dict[str, object]:
    report = Report("example", argparse.Namespace(json_out=str(tmp_path / "example.json")))
    report.print("a note is no figure")
    report.timings("print(1)", [p50_s, p50_s / 2, p50_s * 2])
    report.section("throughput")
    report.figure("executions/s", rate, "/s")
    report.data("a table", [[1, 2]])  # kept in the record only: no number to compare
    return report.record()


def test_figures_are_a_timings_p50_and_a_figures_value_by_section(tmp_path: Path) -> None:
    assert figures(_record(tmp_path, 0.004, 40.0)) == {
        ("", "print(1)"): (0.004, "p50 s"),
        ("throughput", "executions/s"): (40.0, "/s"),
    }


def test_compare_reports_the_median_of_each_side_and_this_over_other(tmp_path: Path) -> None:
    this = [
        figures(_record(tmp_path, s, r)) for s, r in ((0.003, 30.0), (0.005, 50.0), (9.0, 45.0))
    ]
    other = [
        figures(_record(tmp_path, s, r)) for s, r in ((0.004, 40.0), (0.004, 20.0), (0.001, 60.0))
    ]
    report = Report("revisions", argparse.Namespace(json_out=str(tmp_path / "r.json")))
    compare(report, ("new", "old"), (this, other))
    (section,) = [s for s in report.record()["sections"] if s["title"].startswith("this (new)")]
    ratios = {e["label"]: e["value"] for e in section["figures"] if "value" in e}
    # medians: p50 0.005 vs 0.004, rate 45 vs 40
    assert ratios == {"print(1)": pytest.approx(1.25), "executions/s": pytest.approx(1.125)}
    notes = [e["note"] for e in section["figures"] if "value" not in e]
    assert notes == ["  throughput"]  # the section of the figures that follow, by its title
    # Each block's ratio (this block's run over the other's): their range is the spread.
    spreads = {e["label"]: e["note"].partition("; ")[2] for e in section["figures"] if "value" in e}
    assert spreads == {"print(1)": "blocks 0.750-9000.000", "executions/s": "blocks 0.750-2.500"}


def test_a_checkout_with_uncommitted_changes_is_another_revision(tmp_path: Path) -> None:
    """Two checkouts of one commit, one of them changed: their runs must not share a name (the
    driver keys each side's runs by it, and one side's runs were taken for the other's)."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.strip()

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "code.py")
    git("commit", "-qm", "one")
    commit = git("rev-parse", "--short", "HEAD")
    assert _revision(tmp_path) == commit
    (tmp_path / "code.py").write_text("x = 2\n")
    assert _revision(tmp_path) == f"{commit}+changes"
    (tmp_path / "untracked.py").write_text("")
    git("checkout", "-q", "code.py")
    assert _revision(tmp_path) == commit  # an untracked file is not the code under test
