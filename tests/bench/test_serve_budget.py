"""`bench.serve_budget`: a served execution split into the engine, gRPC alone, the SQLite audit
and the rest of serving, block by block, and the best ratio to the floor those parts leave."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.harness import Report
from bench.serve_budget import SERVED_IN_MEMORY, WAYS, print_serving_budget


def _blocks(
    *machine: tuple[float, float, float, float, float],
) -> dict[str, list[dict[str, float]]]:
    blocks: dict[str, list[dict[str, float]]] = {name: [] for name in WAYS}
    for row in machine:
        for name, value in zip(WAYS, row, strict=True):
            blocks[name].append({"machine CPU": value, "executions/s": 1.0})
    return blocks


def _figures(report: Report) -> dict[str, float]:
    return {
        entry["label"]: entry["value"]
        for section in report.record()["sections"]
        for entry in section["figures"]
        if "value" in entry
    }


def test_each_block_is_split_and_the_ceiling_is_the_floor_over_engine_grpc_and_audit(
    tmp_path: Path,
) -> None:
    report = Report("unit", argparse.Namespace(json_out=str(tmp_path / "r.json")))
    # floor, engine, served (SQLite), served (memory), bare gRPC: ms of machine CPU
    print_serving_budget(
        report,
        _blocks((4.0, 5.0, 7.0, 6.5, 0.8), (4.2, 5.2, 7.4, 6.8, 0.9), (4.4, 5.1, 7.2, 6.9, 0.7)),
    )
    figures = _figures(report)
    assert figures["ptc serve c=4 machine CPU: engine"] == pytest.approx(5.1)
    assert figures["ptc serve c=4 machine CPU: gRPC alone"] == pytest.approx(0.8)
    # audits 0.5, 0.6, 0.3; rests 0.7, 0.7, 1.1
    assert figures["ptc serve c=4 machine CPU: SQLite audit"] == pytest.approx(0.5)
    assert figures["ptc serve c=4 machine CPU: rest of serving"] == pytest.approx(0.7)
    # ceilings 4.0/6.3, 4.2/6.7, 4.4/6.1: the median is the block's, not the ratio of medians
    assert figures["ptc serve c=4 ceiling / isolation floor"] == pytest.approx(4.0 / 6.3)
    # what 0.70x leaves: 4.0/0.7 - 6.3 (-0.59), 4.2/0.7 - 6.7 (-0.70), 4.4/0.7 - 6.1 (0.19)
    assert figures["0.70x leaves the rest of serving"] == pytest.approx(4.0 / 0.7 - 6.3)


def test_nothing_is_printed_without_every_way_in_the_run(tmp_path: Path) -> None:
    report = Report("unit", argparse.Namespace(json_out=str(tmp_path / "r.json")))
    blocks = _blocks((4.0, 5.0, 7.0, 6.5, 0.8))
    del blocks[SERVED_IN_MEMORY]
    print_serving_budget(report, blocks)
    assert _figures(report) == {}
