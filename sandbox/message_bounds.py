"""How large a gRPC message can be under limits.

The server's and the client's message limits are sized from these, so that a result the limits
allow always reaches the client and a request larger than any valid one is refused by gRPC
before it is read whole."""

from __future__ import annotations

from sandbox.limits import ResolvedLimits
from sandbox.request_caps import MAX_MANIFEST_BYTES, MAX_SCRIPT_BYTES

__all__ = [
    "FILE_OVERHEAD_BYTES",
    "MAX_OMITTED_LISTED",
    "REQUEST_OVERHEAD_BYTES",
    "RESULT_OVERHEAD_BYTES",
    "files_bytes_bound",
    "request_bytes_bound",
    "request_files_bound",
    "result_bytes_bound",
]

# What a result holds beyond its output and call log, at most: the truncation markers, the
# violations, usage, limits, the script error (type and message are cut at 200 and 2000
# characters), ids and timestamps. Generous: it only sizes a message limit.
RESULT_OVERHEAD_BYTES = 1024**2


def result_bytes_bound(limits: ResolvedLimits) -> int:
    """The most bytes one execution's result can take as a protobuf message under ``limits``.

    Output is kept up to its cap in bytes, but a byte that is not UTF-8 becomes U+FFFD, three
    bytes, in the text a result carries; the call log is bounded by `call_log_bytes` as the
    broker counts it (JSON as the wire carries it, plus a fixed share per call for its other
    fields). Client and server size their gRPC message limits from this, so a result the
    limits allow always reaches the client.
    """
    output = 3 * (limits.stdout_bytes + limits.stderr_bytes)
    return output + limits.call_log_bytes + files_bytes_bound(limits) + RESULT_OVERHEAD_BYTES


# Per file, beside its bytes: its name (at most 1024 bytes), size, sha256 and framing; an omitted
# file's report (name, size, reason) fits the same share.
FILE_OVERHEAD_BYTES = 2048
# Omitted files listed one by one at most; the rest are counted in one last entry.
MAX_OMITTED_LISTED = 100


def files_bytes_bound(limits: ResolvedLimits) -> int:
    """The most bytes a result's returned and omitted files take as protobuf."""
    listed = limits.output_files + MAX_OMITTED_LISTED + 1
    return limits.output_bytes + listed * FILE_OVERHEAD_BYTES


def request_files_bound(limits: ResolvedLimits) -> int:
    """The most bytes a request's input files take as protobuf under ``limits``."""
    return limits.input_bytes + limits.input_files * FILE_OVERHEAD_BYTES


# Everything else a request carries (the labels; expected calls; ids, tokens and names), at
# most; generous, since it only sizes a message limit.
REQUEST_OVERHEAD_BYTES = 1024**2


def request_bytes_bound(ceilings: ResolvedLimits) -> int:
    """The most bytes a valid request takes as protobuf under ``ceilings``: the server's
    receive limit, so that a larger one is refused by gRPC before it is read whole."""
    return (
        MAX_SCRIPT_BYTES
        + MAX_MANIFEST_BYTES
        + request_files_bound(ceilings)
        + REQUEST_OVERHEAD_BYTES
    )
