"""The host's collection of the files a script left under ``outputs/``.

The guest (`sandbox/guest/_files.py`) sends each file it returns as ``out`` frames (chunks in
order) and each file it did not return as an ``omit`` frame. All of it is the script's word:
this collector checks every name again (`sandbox.files.name_problem`), refuses a second file of
the same name, enforces the output limits itself on the sizes the frames declare and carry,
computes every sha256 from the bytes it received, and turns each omission for a limit into a
violation. Frames that contradict themselves (a chunk out of order, more bytes than declared)
are a protocol violation; a file left incomplete when the sandbox ended is omitted.

A violation's ``observed`` here is a size or count the guest reported for files the host never
received, so its evidence is ``guest``; where the host itself refused bytes it did receive, it
is ``host``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from sandbox.files import OMIT_REASONS, OmittedOutput, OutputFile, name_problem
from sandbox.limits import ResolvedLimits
from sandbox.message_bounds import MAX_OMITTED_LISTED
from sandbox.protocol import GuestOmit, GuestOutput, ProtocolViolation
from sandbox.result import Evidence, Violation

__all__ = ["OutputCollector"]

_LIMIT_OF = {"output_files": "count", "output_file_bytes": "bytes", "output_bytes": "bytes"}


@dataclass
class _Partial:
    name: str
    size: int
    data: bytearray = field(default_factory=bytearray)


def _printable(name: str) -> str:
    return "".join(c if 32 <= ord(c) != 127 else "?" for c in name)[:1024]


class OutputCollector:
    """Builds the returned files and the omission report of one execution."""

    def __init__(self, limits: ResolvedLimits) -> None:
        self.limits = limits
        self.files: list[OutputFile] = []
        self.omitted: list[OmittedOutput] = []
        self._names: set[str] = set()
        self._total = 0
        self._partial: _Partial | None = None
        self._skipping: str | None = None  # a file refused at its first chunk
        self._unlisted = 0
        self._host_refused: set[str] = set()  # limits the host enforced on received frames
        # Per reason, listed or not: omitted files, their known sizes summed, the largest.
        self._tally: dict[str, list[int]] = {}

    # -- frames ------------------------------------------------------------------------------
    def receive(self, frame: GuestOutput | GuestOmit) -> None:
        """One frame, in arrival order; raises ProtocolViolation for inconsistent ones."""
        if isinstance(frame, GuestOmit):
            self._end_partial()
            self._skipping = None
            reason = frame.reason if frame.reason in OMIT_REASONS else "unreadable"
            if reason == "more":
                self._unlisted += frame.size or 0
                return
            self._omit(OmittedOutput(_printable(frame.name), reason, frame.size, frame.limit))
            return
        if frame.offset == 0:
            self._end_partial()
            self._skipping = None
            self._start(frame)
        elif self._skipping == frame.name:
            return
        partial = self._partial
        if partial is None:
            if frame.offset != 0:
                raise ProtocolViolation(f"out frame for {frame.name[:100]!r}: no file started")
            return  # refused at its first chunk
        if frame.name != partial.name or frame.offset != len(partial.data):
            raise ProtocolViolation(
                f"out frame for {frame.name[:100]!r}: chunk at {frame.offset} out of order"
            )
        if frame.offset + len(frame.data) > partial.size:
            raise ProtocolViolation(
                f"out frame for {frame.name[:100]!r}: more bytes than the {partial.size} declared"
            )
        partial.data += frame.data
        if len(partial.data) == partial.size:
            self._finish(partial)

    def _start(self, frame: GuestOutput) -> None:
        limits = self.limits
        name, size = frame.name, frame.size
        problem = name_problem(name)
        refused: OmittedOutput | None = None
        if problem is not None:
            refused = OmittedOutput(_printable(name), "bad_name", size, None, f"the name {problem}")
        elif name in self._names:
            refused = OmittedOutput(name, "bad_name", size, None, "the name was returned twice")
        elif len(self.files) >= limits.output_files:
            refused = OmittedOutput(name, "output_files", size, limits.output_files)
        elif size > limits.output_file_bytes:
            refused = OmittedOutput(name, "output_file_bytes", size, limits.output_file_bytes)
        elif self._total + size > limits.output_bytes:
            refused = OmittedOutput(name, "output_bytes", size, limits.output_bytes)
        if refused is not None:
            if refused.reason in _LIMIT_OF:
                self._host_refused.add(refused.reason)
            self._omit(refused)
            self._skipping = name
            return
        self._names.add(name)
        self._total += size
        self._partial = _Partial(name, size)
        if size == 0:
            self._finish(self._partial)

    def _finish(self, partial: _Partial) -> None:
        data = bytes(partial.data)
        self.files.append(
            OutputFile(partial.name, len(data), hashlib.sha256(data).hexdigest(), data)
        )
        self._partial = None

    def _end_partial(self) -> None:
        partial = self._partial
        if partial is not None:
            self._partial = None
            self._total -= partial.size
            self._omit(
                OmittedOutput(
                    partial.name,
                    "unreadable",
                    partial.size,
                    None,
                    f"only {len(partial.data)} of {partial.size} bytes arrived",
                )
            )

    def _omit(self, entry: OmittedOutput) -> None:
        tally = self._tally.setdefault(entry.reason, [0, 0, 0])
        tally[0] += 1
        tally[1] += entry.size or 0
        tally[2] = max(tally[2], entry.size or 0)
        if len(self.omitted) >= MAX_OMITTED_LISTED:
            self._unlisted += 1
        else:
            self.omitted.append(entry)

    # -- the end -----------------------------------------------------------------------------
    def finish(self) -> None:
        """After the sandbox ended: a file still arriving is omitted; unlisted ones counted."""
        self._end_partial()
        if self._unlisted:
            self.omitted.append(
                OmittedOutput("", "more", self._unlisted, None, OMIT_REASONS["more"])
            )
            self._unlisted = 0

    def violations(self) -> list[Violation]:
        """One violation per output limit that omitted files."""
        out: list[Violation] = []
        for limit, unit in _LIMIT_OF.items():
            if limit not in self._tally:
                continue
            count, size_sum, largest = self._tally[limit]
            value = self.limits.value(limit)
            observed = {
                "output_files": len(self.files) + count,
                "output_file_bytes": largest,
                "output_bytes": self._total + size_sum,
            }[limit]
            entries = [e for e in self.omitted if e.reason == limit][:5]
            listed = ", ".join(f"{e.name} ({e.size} bytes)" for e in entries)
            more = f" and {count - len(entries)} more" if count > len(entries) else ""
            out.append(
                Violation(
                    limit,
                    value,
                    observed,
                    unit,
                    "truncated",
                    f"{count} output files omitted: {listed}{more}",
                    evidence=Evidence.HOST if limit in self._host_refused else Evidence.GUEST,
                )
            )
        return out
