"""What ``ptc serve`` adds to the engine, part by part, and the best ratio those parts allow.

`bench.forkserver` runs, in every block, the isolation floor, the embedded engine, ``ptc serve``
with its SQLite audit, the same server with its audit in memory, and a bare gRPC unary call at a
served execution's rate and sizes (`bench.grpc_floor`). From each block's machine CPU per
execution this splits a served execution at concurrency 4 into:

- the engine (what the embedded engine costs: the sandbox and our host);
- gRPC alone (the bare call: both event loops, gRPC's threads, loopback TCP);
- the SQLite audit (the SQLite server over the in-memory one: the admission and the completion,
  each committed before the script starts and before the answer goes, as `SECURITY.md`
  promises);
- the rest of serving (conversion, tenancy, idempotency, metrics, our servicer and client SDK).

and prints, per block then as medians, the ceiling ``floor / (engine + gRPC alone + SQLite
audit)``: the most ``ptc serve``'s rate could reach against the floor were the rest of serving
free. When that ceiling is under the 0.70x target, no work on the server's own code
can reach the target; only a cheaper engine, a cheaper gRPC or a cheaper audit can.

The engine here is the benchmark's, on this process's loop (asyncio's unless ``--loop
uvloop``); ``ptc serve`` runs its engine on uvloop, whose host costs 0.1-0.2 ms less per
execution (``python -m bench.serve_profile --embedded`` against `bench.forkserver`'s host line),
so the ceiling of the server as it runs is about 0.02 higher than printed, and the rest of
serving that much larger. The audit's figure is a difference of two ways' blocks, and so the
noisiest: 0.15-0.65 ms from run to run where the server process alone says 0.35-0.45.
"""

from __future__ import annotations

from bench.harness import Report, percentile

__all__ = ["SERVED_IN_MEMORY", "WAYS", "print_serving_budget"]

SERVED_IN_MEMORY = "ptc serve, audit in memory c=4"
# The ways a block runs that the budget reads, in the order it reads them.
WAYS = (
    "isolation floor c=4",
    "embedded engine c=4",
    "ptc serve + gRPC c=4",
    SERVED_IN_MEMORY,
    "reference: bare gRPC unary c=4",
)
TARGET = 0.70
PARTS = ("engine", "gRPC alone", "SQLite audit", "rest of serving")


def print_serving_budget(report: Report, blocks: dict[str, list[dict[str, float]]]) -> None:
    """``blocks``: each case's figures per timed block, as `bench.forkserver` keeps them."""
    if any(name not in blocks for name in WAYS):
        return
    rows = zip(*(blocks[name] for name in WAYS), strict=True)
    parts: dict[str, list[float]] = {part: [] for part in PARTS}
    ceilings: list[float] = []
    left: list[float] = []
    for floor, engine, served, in_memory, grpc_alone in (
        [block["machine CPU"] for block in row] for row in rows
    ):
        audit = served - in_memory
        parts["engine"].append(engine)
        parts["gRPC alone"].append(grpc_alone)
        parts["SQLite audit"].append(audit)
        parts["rest of serving"].append(in_memory - engine - grpc_alone)
        ceilings.append(floor / (engine + grpc_alone + audit))
        left.append(floor / TARGET - (engine + grpc_alone + audit))
    for part, values in parts.items():
        report.figure(f"ptc serve c=4 machine CPU: {part}", percentile(values, 0.5), "ms")
        report.data(f"ptc serve c=4 {part} (ms) samples", values)
    report.figure(
        "ptc serve c=4 ceiling / isolation floor",
        percentile(ceilings, 0.5),
        "x",
        note=f"floor / (engine + gRPC alone + SQLite audit); blocks {min(ceilings):.2f}-"
        f"{max(ceilings):.2f}; target {TARGET:.2f}",
    )
    report.data("ptc serve ceiling samples", ceilings)
    report.figure(
        f"{TARGET:.2f}x leaves the rest of serving",
        percentile(left, 0.5),
        "ms",
        note=f"blocks {min(left):.2f} to {max(left):.2f}",
    )
