"""`bench.store_scale` at tiny sizes: it fills, times every request path, prints the growth,
and the store it filled (through the API and through the bulk path) verifies."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.harness import Report
from bench.store_scale import main, parser

PATHS = [
    "admission",
    "completion",
    "get by id",
    "idempotency look-up",
    "holder of a session",
    "list: no filter",
    "list: status",
    "list: a tool most call",
    "list: a tool few call",
    "list: violation",
    "list: an old session",
    "list: the small tenant",
    "a session's cells",
    "checkpoint, 20 new",
    "verify since checkpoint",
]


@pytest.mark.parametrize(
    "engine", ["sqlite", pytest.param("postgres", marks=pytest.mark.requires_postgres)]
)
@pytest.mark.parametrize("workload", ["repeat", "unique"])
def test_store_scale_runs_every_path_and_the_store_verifies(
    engine: str, workload: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The bench's own parser, so that an option it gains reaches this test with its default.
    options = f"--sizes 120,300 --engines {engine} --workloads {workload} --rounds 2 --new 20"
    # --api-up-to 150: 150..300 through the bulk path
    args = parser().parse_args([*options.split(), "--api-up-to", "150"])
    args.json_out = str(tmp_path / "r.json")
    args.pg_url = os.environ.get("PTC_TEST_POSTGRES_URL")
    report = Report("store_scale", args)
    main(report, args)
    out = capsys.readouterr().out
    name = f"{engine} ({workload})"
    assert f"{name}: filled to 300 executions" in out
    assert "(30 through admit/complete, 150 in batches)" in out
    assert f"{name}: the whole store verifies: True" in out
    sections = {
        s["title"]: [f for f in s["figures"] if "label" in f] for s in report.record()["sections"]
    }
    growth = sections[f"{name}: growth of p50 from 120 to 300 executions (target at most 1.3x)"]
    assert [f["label"] for f in growth] == PATHS
    at_300 = sections[f"{name}, 300 executions of big (+500 of small)"]
    assert [f["label"] for f in at_300] == [*PATHS, "bytes per execution"]
    assert 500 < at_300[-1]["value"] < 50_000
