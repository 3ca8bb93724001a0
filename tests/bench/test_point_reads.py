"""`bench.point_reads` on a SQLite store: every setting's look-ups, where the keys' tree lies, and
the bare look-up in the store's file and in the tree's copy in a file of its own, alone and each
after a get (its PostgreSQL path: tests/bench/test_store_copy.py)."""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
from pathlib import Path

import pytest

from bench import point_reads
from bench.harness import Report
from bench.session_rebuild import TENANT, prefill


def test_point_reads_looks_inside_a_sqlite_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    source = str(tmp_path / "audit.db")
    prefill(source, 400, Report("fill", argparse.Namespace(json_out=str(tmp_path / "f.json"))))
    conn = sqlite3.connect(source)
    try:
        pages = conn.execute("SELECT COUNT(*) FROM dbstat WHERE name = 'idempotency_keys'")
        tree = int(pages.fetchone()[0])
    finally:
        conn.close()
    reads = argparse.Namespace(
        stores=f"{source}:{TENANT}:400", lookups=30, json_out=str(tmp_path / "p.json")
    )
    point_reads.main(Report("point_reads", reads), reads)
    out = capsys.readouterr().out
    for setting in ("copied", "mapped", "mapped, 64 MiB cache"):
        assert f"400, {setting}, run 2: idempotency p50" in out, setting
    assert f"400: the keys' tree: {tree:,} pages, 0 past the map (2.00 GiB), in 1 stretches" in out
    for where in ("store's file", "tree in its own file"):
        assert f"400, bare, {where}, run 1: p50" in out, where
        assert f"400, bare, {where}, each after a get, run 2: p50" in out, where
    assert "400, bare, store's file, one key: p50" in out
    assert list(scratch.iterdir()) == []  # the tree's copy is deleted with its directory
