"""A replay's report crosses the wire whole: `report_to_proto` then `report_from_proto` gives back
the same `ReplayReport`, its result and every difference (recorded and replayed values as JSON)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox._proto import sandbox_pb2 as pb
from sandbox.codec.replay import report_from_proto, report_to_proto
from sandbox.replay.report import Difference, ReplayReport
from tests.codec.values import RESULTS, json_values, same_times, texts

REPORTS = st.builds(
    ReplayReport,
    execution_id=texts,
    result=RESULTS,
    differences=st.lists(st.builds(Difference, texts, texts, json_values, json_values, texts)),
)


@settings(max_examples=25, deadline=None)
@given(report=REPORTS)
def test_any_report_reads_back_as_it_was_written(report: ReplayReport) -> None:
    message = report_to_proto(report)
    assert message.identical == report.identical
    back = report_from_proto(pb.ReplayReport.FromString(message.SerializeToString()))
    assert replace(back, result=same_times(back.result, report.result)) == report
