"""`bench.grpc_floor`: a bare gRPC call whose method waits as long as asked, over loopback, with
its server in a subprocess that is gone afterwards."""

from __future__ import annotations

import asyncio

from bench.grpc_floor import BareGrpc


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
    # 12 calls, 4 at a time, each waiting 50 ms: three rounds, at least 150 ms.
    assert 0 < figures["calls/s"] <= 12 / 0.15
    assert bare is not None and bare.proc.returncode is not None  # stopped and reaped
