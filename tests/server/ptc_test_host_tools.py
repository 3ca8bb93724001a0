"""Host handlers the test server registers by ``module:function`` (run on the host)."""

from __future__ import annotations

import time


def add(a: int, b: int) -> int:
    return a + b


def slow(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


def broken() -> None:
    raise RuntimeError("the host tool broke")
