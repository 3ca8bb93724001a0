"""`ReplayReport` <-> protobuf, for the `Replay` RPC; light, like `sandbox.wire`, so that the
client imports no server, engine or audit code."""

from __future__ import annotations

import json
from typing import Any

from sandbox._proto import sandbox_pb2 as pb
from sandbox.replay.report import Difference, ReplayReport
from sandbox.wire import result_from_proto, result_to_proto

__all__ = ["report_from_proto", "report_to_proto"]


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _loads(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return text


def report_to_proto(report: ReplayReport) -> pb.ReplayReport:
    return pb.ReplayReport(
        execution_id=report.execution_id,
        identical=report.identical,
        differences=[
            pb.ReplayDifference(
                what=d.what,
                kind=d.kind,
                recorded_json=_json(d.recorded),
                replayed_json=_json(d.replayed),
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
            Difference(d.what, d.kind, _loads(d.recorded_json), _loads(d.replayed_json), d.detail)
            for d in message.differences
        ],
    )
