"""The host's reading of the guest channel: framing, size caps and shape checks.

Everything that arrives here comes from the sandbox and is hostile input. A frame is a 4-byte
big-endian length and a UTF-8 JSON object; anything else (a length over the cap, bad UTF-8 or
JSON, an unknown frame type, a field of the wrong type) raises `ProtocolViolation`, which ends
the execution with a `protocol` violation. Only JSON crosses the boundary, never pickle.
"""

from __future__ import annotations

import binascii
import json
import struct
from dataclasses import dataclass
from typing import Any

__all__ = [
    "HEADER",
    "MAX_TOOL_NAME",
    "GuestCall",
    "GuestEnd",
    "GuestHangUp",
    "GuestMessage",
    "GuestOmit",
    "GuestOutput",
    "GuestReady",
    "ProtocolViolation",
    "decode_body",
    "encode_frame",
    "parse_guest_message",
]

HEADER = struct.Struct(">I")
MAX_TOOL_NAME = 256
MAX_VALUE_CHARS = 64 * 1024 + 64  # the guest caps a cell's value at 64 KiB plus its marker
_MAX_ID = 2**53


class ProtocolViolation(Exception):
    """The guest broke the channel protocol; the message says how."""


@dataclass(frozen=True)
class GuestReady:
    pid: int


@dataclass(frozen=True)
class GuestCall:
    id: int
    tool: str
    arguments: dict[str, Any] | None  # None when the guest announced an oversized call
    oversized_bytes: int = 0


@dataclass(frozen=True)
class GuestEnd:
    status: str
    exit_code: int
    error: dict[str, Any] | None
    value: str | None = None  # a session cell's final expression, as the guest repr'd it


@dataclass(frozen=True)
class GuestHangUp:
    """``bye``: a single-use guest's last frame, after its end report and after it closed its
    stdout and stderr; it exits next (see `sandbox.execution.single_use._SingleUseEnd`)."""


@dataclass(frozen=True)
class GuestOutput:
    """One chunk of a file the guest returns from outputs/: ``data`` at ``offset`` of a file of
    ``size`` bytes (see `sandbox.execution.outputs`)."""

    name: str
    size: int
    offset: int
    data: bytes


@dataclass(frozen=True)
class GuestOmit:
    """A file under outputs/ the guest did not return, and why (its own word)."""

    name: str
    reason: str
    size: int | None
    limit: int | None


_HANG_UP = GuestHangUp()
GuestMessage = GuestReady | GuestCall | GuestEnd | GuestHangUp | GuestOutput | GuestOmit
MAX_FILE_NAME_CHARS = 4096


def encode_frame(message: dict[str, Any]) -> bytes:
    """Strict JSON (no NaN or Infinity) with its length; raises TypeError/ValueError."""
    body = _ENCODER.encode(message).encode()
    return HEADER.pack(len(body)) + body


# One encoder for every frame: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def decode_body(body: bytes | bytearray) -> Any:
    """The JSON value of one frame's body; raises ProtocolViolation for anything else."""
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolViolation(f"frame is not UTF-8 JSON: {exc}") from None


def _int(value: Any, what: str, low: int = 0, high: int = _MAX_ID) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ProtocolViolation(f"{what} must be an integer in [{low}, {high}]")
    return value


def parse_guest_message(obj: Any) -> GuestMessage:
    """Checks the shape of a decoded frame and returns its typed form."""
    if not isinstance(obj, dict):
        raise ProtocolViolation("frame is not a JSON object")
    kind = obj.get("t")
    if kind == "call":
        call_id = _int(obj.get("id"), "call id", 1)
        tool = obj.get("tool")
        if not isinstance(tool, str) or not 0 < len(tool) <= MAX_TOOL_NAME:
            raise ProtocolViolation(f"call {call_id}: tool name must be a string of 1..256 chars")
        if "oversized" in obj:
            size = _int(obj["oversized"], f"call {call_id}: oversized size", 1)
            return GuestCall(call_id, tool, None, size)
        args = obj.get("args")
        if not isinstance(args, dict):
            raise ProtocolViolation(f"call {call_id}: args must be a JSON object")
        return GuestCall(call_id, tool, args)
    if kind == "end":
        status = obj.get("status")
        if status not in ("ok", "error", "syntax_error"):
            raise ProtocolViolation("end frame: unknown status")
        error = obj.get("error")
        if error is not None and not isinstance(error, dict):
            raise ProtocolViolation("end frame: error must be an object")
        value = obj.get("value")
        if value is not None and (not isinstance(value, str) or len(value) > MAX_VALUE_CHARS):
            raise ProtocolViolation(
                f"end frame: value must be a string of at most {MAX_VALUE_CHARS}"
            )
        return GuestEnd(status, _int(obj.get("exit_code"), "exit code", 0, 255), error, value)
    if kind == "ready":
        return GuestReady(_int(obj.get("pid"), "pid", 1, 2**22))
    if kind == "bye":
        return _HANG_UP
    if kind in ("out", "omit"):
        return _parse_file_frame(kind, obj)
    raise ProtocolViolation(f"unknown frame type {str(kind)[:40]!r}")


def _parse_file_frame(kind: str, obj: dict[str, Any]) -> GuestOutput | GuestOmit:
    name = obj.get("name")
    if not isinstance(name, str) or len(name) > MAX_FILE_NAME_CHARS:
        raise ProtocolViolation(f"{kind} frame: name must be a string of at most 4096 chars")
    if kind == "omit":
        reason = obj.get("reason")
        if not isinstance(reason, str) or len(reason) > 40:
            raise ProtocolViolation("omit frame: reason must be a short string")
        size, limit = obj.get("size"), obj.get("limit")
        return GuestOmit(
            name,
            reason,
            None if size is None else _int(size, "omit frame: size"),
            None if limit is None else _int(limit, "omit frame: limit"),
        )
    data = obj.get("data")
    if not isinstance(data, str):
        raise ProtocolViolation("out frame: data must be a base64 string")
    try:
        raw = binascii.a2b_base64(data, strict_mode=True)  # C; b64decode's validate is a regex
    except (ValueError, binascii.Error):
        raise ProtocolViolation("out frame: data is not base64") from None
    return GuestOutput(
        name,
        _int(obj.get("size"), "out frame: size"),
        _int(obj.get("offset"), "out frame: offset"),
        raw,
    )
