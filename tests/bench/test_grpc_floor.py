"""`bench.grpc_floor`: a bare gRPC call whose method waits as long as asked, over loopback, with
its server in a subprocess that is gone afterwards; the waits of a block differ from call to
call around the delay asked for, so that its calls do not run in lockstep."""

from __future__ import annotations

import asyncio
import statistics

from bench.grpc_floor import JITTER, BareGrpc, call_waits


def test_waits_spread_around_the_delay_the_same_way_each_time() -> None:
    waits = call_waits(400, 0.01)
    assert len(waits) == 400
    assert all(0.01 * (1 - JITTER) <= wait <= 0.01 * (1 + JITTER) for wait in waits)
    assert abs(statistics.mean(waits) - 0.01) < 0.001  # the same mean: the same rate
    assert statistics.pstdev(waits) > 0.002  # not one wait for all (uniform +-50%: 0.0029)
    assert call_waits(400, 0.01) == waits


def test_each_call_waits_as_asked_and_the_server_is_stopped() -> None:
    bare: BareGrpc | None = None

    async def run() -> dict[str, float]:
        nonlocal bare
        bare = BareGrpc()
        try:
            return await bare.block(calls=12, concurrency=4, delay_s=0.05)
        finally:
            await bare.close()

    figures = asyncio.run(run())
    # 12 calls, 4 at a time: no faster than the 4 slots sharing the calls' waits evenly.
    assert 0 < figures["calls/s"] <= 12 / (sum(call_waits(12, 0.05)) / 4)
    assert bare is not None and bare.proc.returncode is not None  # stopped and reaped
