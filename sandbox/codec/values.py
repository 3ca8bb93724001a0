"""What every message's codec shares: the enums' names both ways, timestamps, JSON text.

JSON values (tool arguments and results, a replay's recorded values) travel as JSON text, as the
proto's conventions say; a text that is not JSON reads back as the text itself.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from google.protobuf.timestamp_pb2 import Timestamp

from sandbox._proto import sandbox_pb2 as pb

__all__ = [
    "BACKENDS",
    "BACKEND_ENUM",
    "MAX_TIMESTAMP_S",
    "MIN_TIMESTAMP_S",
    "POLICIES",
    "POLICY_ENUM",
    "enum_name",
    "json_text",
    "seconds",
    "timestamp",
    "value_of_json_text",
]

BACKENDS = {
    pb.BACKEND_PROCESS: "process",
    pb.BACKEND_DOCKER: "docker",
    pb.BACKEND_GVISOR: "gvisor",
}
BACKEND_ENUM = {name: value for value, name in BACKENDS.items()}
POLICIES: dict[int, Literal["none", "restricted"]] = {
    pb.SCRIPT_POLICY_NONE: "none",
    pb.SCRIPT_POLICY_RESTRICTED: "restricted",
}
POLICY_ENUM = {"none": pb.SCRIPT_POLICY_NONE, "restricted": pb.SCRIPT_POLICY_RESTRICTED}
# google.protobuf.Timestamp's documented range: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z.
MIN_TIMESTAMP_S = -62_135_596_800
MAX_TIMESTAMP_S = 253_402_300_799


def enum_name(value: int, prefix: str, enum: Any) -> str:
    """A proto enum value's name, without its prefix, in lower case (``"ok"``, ``"active"``)."""
    return str(enum.Name(value)).removeprefix(prefix).lower()


def timestamp(seconds: float) -> Timestamp:
    """``seconds`` to the nearest nanosecond: truncating would send 4.007 as 4.006999999 (its
    float is a hair below), which reads back as another time."""
    stamp = Timestamp()
    stamp.FromNanoseconds(round(seconds * 1e9))
    return stamp


def seconds(stamp: Timestamp) -> float:
    """`timestamp`'s inverse: seconds since the epoch."""
    return stamp.ToNanoseconds() / 1e9


def json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def value_of_json_text(text: str) -> Any:
    """`json_text`'s inverse; empty text is None, and text that is not JSON stays text."""
    try:
        return json.loads(text) if text else None
    except ValueError:
        return text
