"""`ptc replay` of a record whose limits an older version wrote (names in seconds, or only some
fields): it runs under the recorded limits converted to today's fields and today's default for
each limit the record lacks, and its report names those, in `--json` and in the text report. A
record with no limits at all is still refused (tests/replay/test_replay_cli.py). Embedded, on a
real SQLite file, through the real `ptc` command line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from sandbox.audit import Admission, open_store
from sandbox.limits import DEFAULTS, LIMIT_SPECS, ResolvedLimits
from sandbox.older_limits import OlderLimits
from sandbox.result import ExecutionResult, ExecutionStatus
from tests.ptc_cli import run_ptc as ptc

ALL_BUT_TWO = [s.name for s in LIMIT_SPECS if s.name not in ("wall_time", "memory")]


def _record(db: str, execution_id: str, limits: ResolvedLimits | dict[str, int | float]) -> None:
    """An execution recorded under ``limits``: today's complete set, or limits in an older
    format (a dict: names in seconds, or only some fields) as the version that kept them wrote."""
    older = None if isinstance(limits, ResolvedLimits) else OlderLimits(tuple(limits.items()))
    typed = limits if isinstance(limits, ResolvedLimits) else None
    store = open_store(db, instance="old")
    try:
        store.admit(
            Admission(execution_id, "default", "print(1)", "[]", "ab" * 32, "process", "none",
                      typed, expected_calls=(), older_limits=older),
        )  # fmt: skip
        store.complete(
            execution_id,
            ExecutionResult(
                execution_id,
                ExecutionStatus.OK,
                stdout="1\n",
                effective_limits=typed,
                older_limits=older,
            ),
        )
    finally:
        store.close()


def test_limits_in_seconds_replay_converted_and_the_defaulted_ones_are_named(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "audit.db")
    _record(db, "secs1", {"wall_time": 2.5, "memory": 536870912.0})
    done = ptc("replay", "secs1", "--audit-db", db, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["identical"], report["defaulted_limits"]) == (True, ALL_BUT_TWO)
    ran = replace(DEFAULTS, wall_time_ms=2500, memory_bytes=536870912)
    assert report["result"]["limits"] == ran.to_fields()
    shown = ptc("audit", "show", report["replay_execution_id"], "--db", db)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["effective_limits"] == ran.to_fields()
    # The text report says it too, before the outcome.
    text = ptc("replay", "secs1", "--audit-db", db)
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[1] == (
        "── limits the record does not hold (an older format), run at today's defaults: "
        + ", ".join(ALL_BUT_TWO)
    )
    verify = ptc("audit", "verify", "--db", db)
    assert (verify.returncode, verify.stdout) == (0, "ok: 3 records verified\n")


def test_a_partial_set_by_field_replays_and_a_given_limit_is_not_defaulted(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "audit.db")
    # As the version 6 code wrote them: floats by field, 2 of today's 15.
    _record(db, "v6-1", {"memory_bytes": 268435456.0, "wall_time_ms": 3000.0})
    done = ptc("replay", "v6-1", "--audit-db", db, "--json", "--limit", "cpu_time=2")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["defaulted_limits"] == [n for n in ALL_BUT_TWO if n != "cpu_time"]
    assert report["result"]["limits"] == (
        replace(DEFAULTS, wall_time_ms=3000, cpu_time_ms=2000).to_fields()
    )


def test_a_record_with_every_limit_names_none_defaulted(tmp_path: Path) -> None:
    db = str(tmp_path / "audit.db")
    _record(db, "new1", replace(DEFAULTS, wall_time_ms=4000))
    done = ptc("replay", "new1", "--audit-db", db, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["identical"], report["defaulted_limits"]) == (True, [])
    assert report["result"]["limits"]["wall_time_ms"] == 4000
    text = ptc("replay", "new1", "--audit-db", db)
    assert "run at today's defaults" not in text.stdout
