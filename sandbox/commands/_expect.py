"""Reading ``--expect TOOL=MIN[:MAX]``, the expected number of calls of a tool, for the commands
that take it (`ptc run`, and `ptc mcp` for every script it runs).

The broker checks the counts when the script ends (`sandbox.expectations`); this only parses the
flag, so that a malformed one is refused naming it before anything runs.
"""

from __future__ import annotations

from sandbox.errors import InvalidArgument
from sandbox.expectations import ExpectedCalls

__all__ = ["parse_expect"]


def parse_expect(items: list[str]) -> tuple[ExpectedCalls, ...]:
    """One `ExpectedCalls` per ``TOOL=MIN[:MAX]`` (either bound may be empty: no bound); the last
    ``=`` splits, so a tool name may hold one. `InvalidArgument` naming the item otherwise."""
    out = []
    for item in items:
        tool, sep, counts = item.rpartition("=")
        low, _, high = counts.partition(":")
        try:
            if not sep or not tool:
                raise ValueError
            out.append(ExpectedCalls(tool, int(low) if low else None, int(high) if high else None))
        except ValueError:
            raise InvalidArgument(f"--expect {item!r}: expected TOOL=MIN[:MAX]") from None
    return tuple(out)
