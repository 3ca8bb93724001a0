"""The expected-cardinality check: did the script call each tool as often as the request said?

A model that silently enumerates 70 of 100 items passes every syntactic check; comparing the
call log with what the request implied is what catches it. Counted calls are the ones the
broker accepted for dispatch (any status but `refused`), so a refused call does not count as
done. The check runs after the script has ended, so its action is `reported`: nothing was
stopped or refused, the shortfall or excess is only stated (with the broker's count as the
evidence, `host`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from sandbox.result import CallRecord, CallStatus, Evidence, Violation

__all__ = ["ExpectedCalls", "check_expected_calls"]


@dataclass(frozen=True)
class ExpectedCalls:
    tool: str
    min: int | None = None
    max: int | None = None


def check_expected_calls(
    expected: Iterable[ExpectedCalls], calls: Iterable[CallRecord]
) -> list[Violation]:
    counts = Counter(c.tool for c in calls if c.status != CallStatus.REFUSED)
    out: list[Violation] = []
    for item in expected:
        seen = counts[item.tool]
        if item.min is not None and seen < item.min:
            out.append(
                Violation(
                    "expected_calls",
                    item.min,
                    seen,
                    "count",
                    "reported",
                    f"{item.tool}: expected at least {item.min} calls, saw {seen}",
                    evidence=Evidence.HOST,
                )
            )
        if item.max is not None and seen > item.max:
            out.append(
                Violation(
                    "expected_calls",
                    item.max,
                    seen,
                    "count",
                    "reported",
                    f"{item.tool}: expected at most {item.max} calls, saw {seen}",
                    evidence=Evidence.HOST,
                )
            )
    return out
