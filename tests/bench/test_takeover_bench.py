"""`bench.session_rebuild --history` and `bench.point_reads` at tiny sizes: the store is filled
to each size (and topped up, not refilled, when kept), every rebuild's take-over is timed from
the code's clock points, and the point reads run on the filled file."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import pytest

from bench import point_reads
from bench.harness import Report
from bench.session_rebuild import main as rebuild_main
from bench.session_rebuild import prefill
from sandbox.audit import open_store


def test_session_rebuild_times_the_take_over_at_each_history_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(tmp_path / "audit.db")
    args = argparse.Namespace(
        rounds=1,
        warmup=0,
        backend="process",
        history="200,400",
        store=store,
        pg_url=None,
        json_out=str(tmp_path / "r.json"),
    )
    report = Report("session_rebuild", args)
    asyncio.run(rebuild_main(report, args))
    out = capsys.readouterr().out
    assert "filled the store from 0 to 200 executions of 'default'" in out
    assert "filled the store from 200 to 400 executions of 'default'" in out
    sections = {s["title"]: s["figures"] for s in report.record()["sections"]}
    at_400 = sections[
        "400 executions in the store: rebuild a session (take-over, replay, verify) on process"
    ]
    by_label = {f["label"]: f for f in at_400 if "label" in f}
    for case in ("10 cells", "100 cells", "10 cells, dead holder"):
        parts = [
            by_label[f"{case}: {name}"]["samples"][0]
            for name in ("asked -> taken over", "taken over -> first cell sent")
        ]
        whole = by_label[f"{case}: asked -> first cell sent"]["samples"][0]
        assert all(p > 0 for p in parts) and whole == pytest.approx(sum(parts))
        assert whole < by_label[f"{case}: wall time"]["samples"][0]
    # The dead holder's case took the session from bench-dead, whose lease had run out.
    opened = open_store(store)
    try:
        taken = opened._db.read_one("SELECT payload FROM entries WHERE kind = 'taken_over'")
    finally:
        opened.close()
    from_dead = [row for row in taken if json.loads(row[0])["from"] == "bench-dead"]
    assert len(from_dead) == 2  # one round at each history size
    prefill(store, 400, report)  # kept: nothing to add
    assert "filled the store" not in capsys.readouterr().out

    reads = argparse.Namespace(
        stores=f"{store}:default:400", lookups=50, json_out=str(tmp_path / "p.json")
    )
    report = Report("point_reads", reads)
    point_reads.main(report, reads)
    sections = {s["title"]: s["figures"] for s in report.record()["sections"]}
    figures = [f for f in sections[f"400 executions of 'default' ({store})"] if "label" in f]
    labels = [f["label"] for f in figures]
    # Each setting's two reads in each of two runs; what else the bench shows of the keys' tree
    # is tests/bench/test_point_reads.py's.
    expected = [
        f"400, {setting}, run {run}: {read} p50"
        for setting in ("copied", "mapped", "mapped, 64 MiB cache")
        for run in (1, 2)
        for read in ("get by id", "idempotency")
    ]
    assert sorted(label for label in labels if label in expected) == sorted(expected), labels
    assert all(f["value"] > 0 for f in figures)
