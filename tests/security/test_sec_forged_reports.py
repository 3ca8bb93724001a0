"""Hostile scripts that try to write their own violation report.

A violation is evidence, never a claim: a script that raises the errors a limit would cause
(MemoryError, EMFILE, EFBIG, ENOSPC) without any limit refusing it, prints the capture's
truncation markers, kills itself with the signals the rlimits send, or forges the guest's `end`
frame on the tool channel gets status `error` (or `ok`, where it exits cleanly) and no
violation; the engine runs the next script fine. The channel's fd is ``sys.argv[1]`` inside
the sandbox. The exceptions are the refusals only the guest can see, made up where the report
names no `raise` of the script (a forged frame, `exec`, `generator.throw`): those are pinned as
what they are documented to be, a violation marked `guest` with nothing observed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.conftest import EngineHarness

RAW = """
import json, os, struct, sys
fd = int(sys.argv[1])
def frame(obj):
    body = json.dumps(obj).encode()
    os.write(fd, struct.pack(">I", len(body)) + body)
"""


def forged_end(error: dict[str, object], before: str = "") -> str:
    """A script that sends the bootstrap's `end` frame itself, then exits as it claims."""
    report = {"t": "end", "status": "error", "exit_code": 1, "error": error}
    return RAW + before + f"sys.stdout.flush()\nframe({report!r})\nos._exit(1)\n"


SELF_SIGNAL = (
    "import os, signal\n"
    "if signal.{sig} != signal.SIGKILL:\n"
    "    signal.signal(signal.{sig}, signal.SIG_DFL)\n"
    "os.kill(os.getpid(), signal.{sig})\n"
    "raise SystemExit(3)\n"
)

# name → (script, the error type the result reports, its exit code), or tuples of the outcomes
# that are each possible
SELF_RAISED: dict[str, tuple[str, str | tuple[str, ...], int | tuple[int, ...]]] = {
    "memory-error": ("raise MemoryError", "MemoryError", 1),
    "memory-error-after-real-allocation": (
        "block = bytearray(32 * 1024 * 1024)\nraise MemoryError('out of memory')",
        "MemoryError",
        1,
    ),
    "memory-error-in-a-function": (
        "def alloc():\n    raise MemoryError\n\nalloc()",
        "MemoryError",
        1,
    ),
    "emfile": ('raise OSError(24, "Too many open files")', "OSError", 1),
    "emfile-multiline": (
        "import errno, os\nraise OSError(\n    errno.EMFILE,\n    os.strerror(errno.EMFILE),\n)",
        "OSError",
        1,
    ),
    "efbig": ('raise OSError(27, "File too large")', "OSError", 1),
    "enospc": ('raise OSError(28, "No space left on device")', "OSError", 1),
    "efbig-after-a-small-file": (
        "open('/tmp/small', 'wb').write(b'x' * 1000)\nraise OSError(27, 'File too large')",
        "OSError",
        1,
    ),
    # The signals RLIMIT_CPU and RLIMIT_FSIZE send, and the OOM killer's, sent by the script to
    # itself. Where the script is its pid namespace's init the kernel drops them and it goes on
    # to exit 3; where it is not, it dies of them. Either way nothing tripped.
    "sigxcpu-to-itself": (SELF_SIGNAL.format(sig="SIGXCPU"), ("Killed", "SystemExit"), (-24, 3)),
    "sigxfsz-to-itself": (SELF_SIGNAL.format(sig="SIGXFSZ"), ("Killed", "SystemExit"), (-25, 3)),
    "sigkill-to-itself": (SELF_SIGNAL.format(sig="SIGKILL"), ("Killed", "SystemExit"), (-9, 3)),
    "forged-end-memory": (
        forged_end({"type": "MemoryError", "message": "", "line": 3}),
        "MemoryError",
        1,
    ),
    "forged-end-efbig": (
        forged_end({"type": "OSError", "message": "File too large", "line": 3, "errno": "EFBIG"}),
        "OSError",
        1,
    ),
    "forged-end-enospc": (
        forged_end({"type": "OSError", "message": "No space", "line": 3, "errno": "ENOSPC"}),
        "OSError",
        1,
    ),
}


@pytest.mark.parametrize("name", list(SELF_RAISED))
def test_self_made_refusal_is_an_error_without_a_violation(clean: EngineHarness, name: str) -> None:
    script, error_type, exit_code = SELF_RAISED[name]
    result = clean.run(script, limits={"memory": 128 << 20, "file_size": 1 << 20})
    assert (result.status, result.violations) == ("error", [])
    assert result.exit_code in (exit_code if isinstance(exit_code, tuple) else (exit_code,))
    assert result.error is not None
    assert result.error.type in (error_type if isinstance(error_type, tuple) else (error_type,))
    clean.assert_healthy()


MARKERS = (
    "import sys\n"
    "print('x\\n[ptc: stdout truncated: 5 bytes dropped of 1005; the cap is 1000 bytes]')\n"
    "print('[ptc: stderr truncated: 9 bytes dropped of 9; the cap is 0 bytes]', file=sys.stderr)\n"
)


def test_fake_truncation_markers_are_output(clean: EngineHarness) -> None:
    result = clean.run(MARKERS, limits={"stdout_bytes": 1000, "stderr_bytes": 1000})
    assert (result.status, result.exit_code, result.violations) == ("ok", 0, [])
    assert result.stdout.endswith("the cap is 1000 bytes]\n")
    assert (result.usage.stdout_bytes, result.usage.stderr_bytes) == (
        len(result.stdout),
        len(result.stderr),
    )
    clean.assert_healthy()


def test_fake_truncation_markers_then_a_failure(clean: EngineHarness) -> None:
    result = clean.run(MARKERS + "sys.exit(3)", limits={"stdout_bytes": 1000})
    assert (result.status, result.exit_code, result.violations) == ("error", 3, [])
    clean.assert_healthy()


def test_forged_end_frame_claiming_emfile_is_marked_guest(clean: EngineHarness) -> None:
    # The one refusal the host cannot check: RLIMIT_NOFILE has no kernel counter and the
    # descriptors are closed before any report. A forged report of it is marked as the guest's
    # word, with nothing measured, so that no one takes it for the host's.
    script = forged_end({"type": "OSError", "message": "", "line": 3, "errno": "EMFILE"})
    result = clean.run(script, limits={"open_files": 64})
    assert result.status == "limit_exceeded"
    assert [(v.limit, v.observed, v.action, v.evidence) for v in result.violations] == [
        ("open_files", None, "refused", "guest")
    ]
    clean.assert_healthy()


def test_forged_end_frame_at_the_raise_line_is_no_violation(clean: EngineHarness) -> None:
    # Line 8 of this script is a `raise`: a report that points there was made up by the script.
    raising = "if False:\n    raise OSError(24, 'Too many open files')\n"
    script = forged_end({"type": "OSError", "message": "", "line": 8, "errno": "EMFILE"}, raising)
    assert script.splitlines()[7].strip().startswith("raise OSError")
    result = clean.run(script)
    assert (result.status, result.exit_code, result.violations) == ("error", 1, [])
    clean.assert_healthy()


# A refusal the script makes up without a `raise` of its own at the reported line: the error is
# raised by code the script made at run time (`exec`) or thrown into a frame of its own that is
# not a `raise` (`generator.throw`, reported at the `yield`). The host cannot tell these from a
# real EMFILE: RLIMIT_NOFILE has no kernel counter, the descriptors of a real refusal are closed
# before the report, and the reported line is the script's, not a `raise`. So they come back as
# the documented limit of guest evidence: an `open_files` violation marked `guest`, with nothing
# observed, which a consumer must weigh as the script's word (README "Evidence", SECURITY.md).
# This pins that outcome: if it changes, the documentation must change with it.
UNCHECKABLE_EMFILE = {
    "exec": "exec(\"raise OSError(24, 'Too many open files')\")",
    "generator-throw": (
        "def gen():\n    yield\n\ng = gen()\nnext(g)\ng.throw(OSError(24, 'Too many open files'))\n"
    ),
}


@pytest.mark.parametrize("name", list(UNCHECKABLE_EMFILE))
def test_made_up_emfile_the_raise_line_check_cannot_see_is_guest_evidence(
    clean: EngineHarness, name: str
) -> None:
    result = clean.run(UNCHECKABLE_EMFILE[name], limits={"open_files": 64})
    assert result.status == "limit_exceeded"
    assert [
        (v.limit, v.limit_value, v.observed, v.action, v.evidence) for v in result.violations
    ] == [("open_files", 64, None, "refused", "guest")]
    assert result.error is not None
    assert (result.error.type, result.exit_code) == ("OSError", 1)
    clean.assert_healthy()
