"""The cost of line-buffered guest output against the block-buffered stdout it replaced.

Run: ``python -m bench.output [--rounds N] [--backend process|docker|gvisor]``. The guest makes
its stdout line-buffered so that every complete line reaches the host before any kill
(`sandbox/guest/bootstrap.py`); the baseline is the same script with the interpreter's block
buffer put back by the script itself (`BLOCK_BUFFERED`, its first line: nothing in the
production job frame serves a benchmark), run interleaved with it block by block in the same
run (`bench.harness`):

1. A 100,000-line print loop (``print(i)``, about 590 KB): the loop's own time inside the
   sandbox, flush included, and the execution end to end through the embedded `Engine`.
2. One 10 MB write (``sys.stdout.write``, one newline at its end): the same two figures.

Each figure is printed as p50/p95 for both, with the ratio of the p50s and, for the loop, the
cost per line. The script also reports its stdout's ``line_buffering``, checked to be what the
case says, so the baseline cannot silently measure the new path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from bench.harness import Report, bench_parser, interleave, percentile
from sandbox.backends.factory import BackendOptions, build_backend
from sandbox.engine import Engine, EngineConfig, ExecutionRequest
from sandbox.limits import parse_limit_args

LINES = 100_000
WRITE_BYTES = 10_000_000
# The script times its own output and says so on stderr: seconds, then line_buffering.
TIMED = (
    "import sys, time\n"
    "started = time.perf_counter()\n"
    "{body}"
    "sys.stdout.flush()\n"
    "print(time.perf_counter() - started, sys.stdout.line_buffering, file=sys.stderr)\n"
)
SCRIPTS = {
    "print loop": TIMED.format(body=f"for i in range({LINES}):\n    print(i)\n"),
    "10 MB write": TIMED.format(body=f"sys.stdout.write('x' * {WRITE_BYTES - 1} + '\\n')\n"),
}
# The baseline's first line: stdout back to the interpreter's block buffer on a pipe (the guest
# makes it line-buffered right before the script runs, and a script may change it for itself).
BLOCK_BUFFERED = "import sys\nsys.stdout.reconfigure(line_buffering=False)\n"
LIMITS = parse_limit_args(["stdout_bytes=16777216", "wall_time=120", "cpu_time=120"])


def _backend(name: str) -> Any:
    return build_backend(name, BackendOptions(pool_size=2))


def _case(
    engine: Engine, script: str, buffered: bool, inside: list[float]
) -> Callable[[], Awaitable[None]]:
    request = ExecutionRequest(
        script=BLOCK_BUFFERED + script if buffered else script, limits=LIMITS
    )

    async def run() -> None:
        result = await engine.execute(request)
        assert result.status == "ok" and not result.violations, result.to_json()
        seconds, line_buffering = result.stderr.split()
        assert line_buffering == str(not buffered), (buffered, result.stderr)
        inside.append(float(seconds))

    return run


async def main(report: Report, rounds: int, warmup: int, backend_name: str) -> None:
    backend = _backend(backend_name)
    engine = Engine(EngineConfig(backends={backend_name: backend}, default_backend=backend_name))
    await engine.start()
    try:
        for number, (name, script) in enumerate(SCRIPTS.items(), 1):
            report.section(f"{number}. {name} ({backend_name} backend)")
            inside: dict[str, list[float]] = {"line-buffered (now)": [], "block-buffered": []}
            labels = list(inside)
            times = await interleave(
                {
                    labels[0]: _case(engine, script, False, inside[labels[0]]),
                    labels[1]: _case(engine, script, True, inside[labels[1]]),
                },
                rounds,
                warmup=warmup,
                before=backend.pool.wait_ready,
            )
            for label in labels:
                # The warm-up's samples were appended too: keep the timed rounds only.
                kept = inside[label][-rounds:]
                report.timings(f"{label}, inside the script", kept)
                report.timings(f"{label}, end to end", times[label])
            now_in = percentile(inside[labels[0]][-rounds:], 0.5)
            before_in = percentile(inside[labels[1]][-rounds:], 0.5)
            now_e2e, before_e2e = (percentile(times[label], 0.5) for label in labels)
            report.figure("ratio p50, inside the script", now_in / before_in, "x")
            report.figure("ratio p50, end to end", now_e2e / before_e2e, "x")
            if name == "print loop":
                per_line = (now_e2e - before_e2e) / LINES * 1e6
                report.figure("cost per line, end to end", per_line, "us")
    finally:
        await engine.close()


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=10)
    parser.add_argument("--backend", choices=["process", "docker", "gvisor"], default="process")
    args = parser.parse_args()
    with Report("output", args) as report:
        asyncio.run(main(report, args.rounds, args.warmup, args.backend))
