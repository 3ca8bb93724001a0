"""bench.output's baseline switch: `block_buffered_output` leaves the guest's stdout
block-buffered for the jobs sent inside it, and only for those; every other run gets the
line-buffered streams that keep output written before a kill."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandbox.execution.drive import block_buffered_output

if TYPE_CHECKING:
    from tests.conftest import EngineHarness

PROBE = "import sys\nprint(sys.stdout.line_buffering, sys.stderr.line_buffering)"


def test_the_baseline_switch_keeps_the_old_buffer_only_inside_it(clean: EngineHarness) -> None:
    assert clean.run(PROBE).stdout == "True True\n"
    with block_buffered_output():
        # The interpreter's defaults: stdout by blocks on a pipe, stderr by lines.
        assert clean.run(PROBE).stdout == "False True\n"
    assert clean.run(PROBE).stdout == "True True\n"
