"""The host's memory sum over a sandbox's processes (`sandbox.backends.process.host_meter`) on a
real process tree: a child between its fork and its exec is its parent's memory, copy-on-write,
and counts only what it faulted in itself the first time a walk finds it; from the next walk on
it counts whole again (a fork bomb's children waiting for a CPU to exec summed past the memory
limit, tests/deploy/test_kubernetes_variants.py's `_fork_bomb_beside_threads`)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from sandbox.backends.process.host_meter import ProcessTreeMeter

MIB = 1024 * 1024
CHILDREN = 8
# 64 MiB touched, then 8 children forked that neither write to it nor exec until told to.
FORKER = f"""
import os, sys
block = bytearray(64 * {MIB})
for i in range(0, len(block), 4096):
    block[i] = 1
read, write = os.pipe()
for _ in range({CHILDREN}):
    if os.fork() == 0:
        os.close(write)
        os.read(read, 1)
        os._exit(0)
print("forked", flush=True)
sys.stdin.read()
os.close(write)
"""


@pytest.fixture
def forker() -> Iterator[subprocess.Popen[str]]:
    with subprocess.Popen(
        [sys.executable, "-c", FORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as process:
        assert process.stdout is not None and process.stdin is not None
        try:
            assert process.stdout.readline() == "forked\n"
            yield process
        finally:
            process.stdin.close()
            process.wait(timeout=30)


def test_forked_children_count_what_they_faulted_in_at_their_first_walk(
    forker: subprocess.Popen[str],
) -> None:
    meter = ProcessTreeMeter(forker.pid)
    first = meter.sample()
    assert first.processes == 1 + CHILDREN
    # The parent's 64 MiB once, and each child's own faults (a fork costs a few hundred KiB of
    # copied pages: the interpreter's reference counts): far below the 9 x 64 MiB of the
    # processes' resident anonymous memory summed whole.
    assert 64 * MIB < first.memory_bytes < (64 + CHILDREN * 4) * MIB, first
    second = meter.sample()
    # Seen before: counted whole, as every process is after its first walk.
    assert second.memory_bytes > (1 + CHILDREN) * 64 * MIB, second
    assert meter.peak_memory_bytes == second.memory_bytes
