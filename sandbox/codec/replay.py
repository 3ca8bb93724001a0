"""`ReplayReport` <-> protobuf, for the `Replay` RPC: a replay's result and how it differs from
the record (each recorded and replayed value as JSON text)."""

from __future__ import annotations

from sandbox._proto import sandbox_pb2 as pb
from sandbox.codec.result import result_from_proto, result_to_proto
from sandbox.codec.values import json_text, value_of_json_text
from sandbox.replay_report import Difference, ReplayReport

__all__ = ["report_from_proto", "report_to_proto"]


def report_to_proto(report: ReplayReport) -> pb.ReplayReport:
    return pb.ReplayReport(
        execution_id=report.execution_id,
        identical=report.identical,
        differences=[
            pb.ReplayDifference(
                what=d.what,
                kind=d.kind,
                recorded_json=json_text(d.recorded),
                replayed_json=json_text(d.replayed),
                detail=d.detail,
            )
            for d in report.differences
        ],
        result=result_to_proto(report.result),
    )


def report_from_proto(message: pb.ReplayReport) -> ReplayReport:
    return ReplayReport(
        execution_id=message.execution_id,
        result=result_from_proto(message.result),
        differences=[
            Difference(
                d.what,
                d.kind,
                value_of_json_text(d.recorded_json),
                value_of_json_text(d.replayed_json),
                d.detail,
            )
            for d in message.differences
        ],
    )
