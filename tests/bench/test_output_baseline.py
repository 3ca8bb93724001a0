"""bench.output's baseline: a script that starts with `BLOCK_BUFFERED` runs with the
interpreter's block-buffered stdout, and every other run gets the line-buffered streams that
keep output written before a kill. Nothing in the job frame switches it: the baseline is the
script's own doing, so a production run cannot be switched by it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bench.output import BLOCK_BUFFERED

if TYPE_CHECKING:
    from tests.conftest import EngineHarness

PROBE = "import sys\nprint(sys.stdout.line_buffering, sys.stderr.line_buffering)"


def test_the_baseline_keeps_the_old_buffer_only_for_its_own_script(clean: EngineHarness) -> None:
    assert clean.run(PROBE).stdout == "True True\n"
    # The interpreter's defaults: stdout by blocks on a pipe, stderr by lines.
    assert clean.run(BLOCK_BUFFERED + PROBE).stdout == "False True\n"
    assert clean.run(PROBE).stdout == "True True\n"
