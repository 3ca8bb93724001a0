"""A replay's report crosses the wire whole: `report_to_proto` then `report_from_proto` gives back
the same `ReplayReport`, its result and every difference (recorded and replayed values as JSON)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.codec.replay import report_from_proto, report_to_proto
from sandbox.replay_report import Difference, ReplayReport
from tests.codec.values import RESULTS, json_values, same_times, texts, through_the_wire

REPORTS = st.builds(
    ReplayReport,
    execution_id=texts,
    result=RESULTS,
    differences=st.lists(st.builds(Difference, texts, texts, json_values, json_values, texts)),
)


@settings(max_examples=25, deadline=None)
@given(report=REPORTS)
def test_any_report_reads_back_as_it_was_written(report: ReplayReport) -> None:
    assert report_to_proto(report).identical == report.identical
    back = through_the_wire(report, report_to_proto, report_from_proto)
    assert replace(back, result=same_times(back.result, report.result)) == report
