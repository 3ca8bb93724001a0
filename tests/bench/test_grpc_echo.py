"""`bench.grpc_echo`: a bare echo of issue 40's sizes, on each server kind, whose client and
server are subprocesses that are gone afterwards, and whose figures are CPU per call."""

from __future__ import annotations

import pytest

from bench.grpc_echo import KINDS, BareEcho


@pytest.mark.parametrize("kind", KINDS)
def test_a_block_is_timed_and_both_processes_are_stopped(kind: str) -> None:
    echo = BareEcho(kind, concurrency=4)
    try:
        figures = echo.block(200)
    finally:
        echo.close()
    assert figures["calls/s"] > 0
    # Each process did work for its calls (a call costs tens of microseconds at the least), and
    # the echo's figure is their sum.
    assert figures["server"] > 0 and figures["client"] > 0
    assert figures["echo"] == pytest.approx(figures["server"] + figures["client"])
    assert echo.server.returncode is not None and echo.client.returncode == 0
