"""`bench.serve_ceiling`: two durable commits per execution in a real SQLite file, and the served
ceiling floor / (floor + echo + commits) from a run's blocks, by each way's own CPU."""

from __future__ import annotations

import argparse
import sqlite3
from pathlib import Path

import pytest

from bench.harness import Report
from bench.serve_ceiling import (
    COMMITS,
    COMMITS_NORMAL,
    ECHO_AIO,
    ECHO_THREADS,
    PACED,
    REST,
    DurableCommits,
    print_ceiling,
)


def _figures(report: Report) -> dict[str, float]:
    return {
        entry["label"]: entry["value"]
        for section in report.record()["sections"]
        for entry in section["figures"]
        if "value" in entry
    }


@pytest.mark.parametrize(("synchronous", "level"), [("FULL", 2), ("NORMAL", 1)])
def test_each_execution_commits_its_row_twice_durably(synchronous: str, level: int) -> None:
    commits = DurableCommits(synchronous)
    try:
        path = Path(commits.dir.name) / "commits.db"
        figures = commits.block(20)
        assert commits.db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert commits.db.execute("PRAGMA synchronous").fetchone() == (level,)
        # Another connection sees every row completed: each transaction was committed.
        other = sqlite3.connect(path)
        try:
            rows = other.execute("SELECT status, length(body) FROM records").fetchall()
        finally:
            other.close()
        assert rows == [("ok", 1500)] * 20
        assert figures["commits"] > 0 and figures["executions/s"] > 0
    finally:
        commits.close()
    assert not path.exists()


def _way(machine: float, rest: float) -> dict[str, float]:
    return {"machine CPU": machine, REST: rest, "executions/s": 1.0}


def test_the_ceiling_is_the_floor_over_floor_echo_and_commits_by_own_cpu(tmp_path: Path) -> None:
    report = Report("unit", argparse.Namespace(json_out=str(tmp_path / "r.json")))
    echo = [{"client": 0.1, "server": 0.15, "echo": 0.25, "executions/s": 1.0}] * 3
    blocks = {
        # own CPU (machine - rest): floors 4.0, 5.0, 4.5; engines 5.0, 5.5, 6.0; served 6.0 ...
        "isolation floor c=4": [_way(6.0, 2.0), _way(8.0, 3.0), _way(5.0, 0.5)],
        "embedded engine c=4": [_way(7.0, 2.0), _way(6.5, 1.0), _way(9.0, 3.0)],
        "ptc serve + gRPC c=4": [_way(9.0, 3.0), _way(8.0, 1.0), _way(7.5, 0.5)],
        ECHO_THREADS: echo,
        ECHO_AIO: echo,
        COMMITS: [{"commits": c, "executions/s": 1.0} for c in (0.1, 0.2, 0.15)],
    }
    print_ceiling(report, blocks)
    figures = _figures(report)
    assert figures["isolation floor c=4: own CPU per execution"] == pytest.approx(4.5)
    assert figures["two durable commits (WAL, synchronous=FULL): CPU"] == pytest.approx(0.15)
    assert figures["bare gRPC echo, thread-pool server c=4: CPU per call"] == pytest.approx(0.25)
    assert figures["served ceiling c=4: floor / (floor + echo + commits)"] == pytest.approx(
        4.5 / (4.5 + 0.25 + 0.15)
    )
    assert not any("paced" in label for label in figures)  # no bench.grpc_floor blocks
    # ptc serve's own CPU 6.0, 7.0, 7.0: median 7.0
    assert figures["ptc serve + gRPC c=4: own CPU per execution"] == pytest.approx(7.0)
    assert "isolation floor c=32: own CPU per execution" not in figures  # no such blocks


def test_the_floors_sandboxes_are_counted_by_their_cgroups_as_the_engines_are(
    tmp_path: Path,
) -> None:
    report = Report("unit", argparse.Namespace(json_out=str(tmp_path / "r.json")))
    floor = {**_way(9.0, 2.0), "sandboxes (fork to exit)": 3.5, "sandboxes (their cgroups)": 3.0}
    blocks = {
        "isolation floor c=4": [floor],
        ECHO_THREADS: [{"client": 0.1, "server": 0.1, "echo": 0.2, "executions/s": 1.0}],
        COMMITS: [{"commits": 0.3, "executions/s": 1.0}],
    }
    print_ceiling(report, blocks)
    # 9.0 - 2.0 (the rest), less 0.5 of the sandboxes' CPU before they joined their cgroups
    assert _figures(report)["isolation floor c=4: own CPU per execution"] == pytest.approx(6.5)


def test_a_second_ceiling_puts_in_the_call_paced_as_served_executions_are(
    tmp_path: Path,
) -> None:
    report = Report("unit", argparse.Namespace(json_out=str(tmp_path / "r.json")))
    paced = [
        {"server process": s, "client (this process)": c, "executions/s": 1.0}
        for s, c in ((0.4, 0.3), (0.35, 0.25), (0.5, 0.3))
    ]
    blocks = {
        "isolation floor c=4": [_way(7.0, 2.0)],
        ECHO_THREADS: [{"client": 0.1, "server": 0.1, "echo": 0.2, "executions/s": 1.0}],
        COMMITS: [{"commits": 0.3, "executions/s": 1.0}],
        PACED: paced,
        COMMITS_NORMAL: [{"commits": 0.05, "executions/s": 1.0}],
    }
    print_ceiling(report, blocks)
    figures = _figures(report)
    assert figures["the same call paced as served executions are: CPU per call"] == (
        pytest.approx(0.7)
    )
    assert figures["the same with synchronous=NORMAL: CPU"] == pytest.approx(0.05)
    label = "served ceiling c=4 with the call paced: floor / (floor + paced + commits)"
    assert figures[label] == pytest.approx(5.0 / (5.0 + 0.7 + 0.3))
    assert figures["served ceiling c=4: floor / (floor + echo + commits)"] == pytest.approx(
        5.0 / 5.5
    )


def test_only_full_or_normal_is_asked_for() -> None:
    with pytest.raises(ValueError, match=r"synchronous: 'OFF; DROP TABLE records' is neither"):
        DurableCommits("OFF; DROP TABLE records")


def test_nothing_is_printed_without_the_echo_and_the_commits(tmp_path: Path) -> None:
    report = Report("unit", argparse.Namespace(json_out=str(tmp_path / "r.json")))
    print_ceiling(report, {"isolation floor c=4": [_way(6.0, 2.0)]})
    assert _figures(report) == {}
