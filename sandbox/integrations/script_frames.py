"""The script's own frames of a traceback, as the observation shows them: frames of the
sandbox's runtime, the generated stubs, the standard library and an adapter's prelude are folded
into one counted marker; the script's frames carry the model's line numbers (`ScriptSource`
knows which lines are a prelude's) and, when the script is known, its source line. The
TypeScript observation mirrors this module (`clients/typescript/src/observation/traceback.ts`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SCRIPT_FILE", "ScriptSource", "error_line", "script_frames"]

# The file name the guest compiles the script under (`sandbox/guest/bootstrap.py` SCRIPT_NAME);
# a real execution in tests/integrations/test_observation.py keeps the two in step.
SCRIPT_FILE = "<script>"


@dataclass(frozen=True)
class ScriptSource:
    """The script that ran, so tracebacks can show its lines. ``prelude_lines`` lines of set-up
    code an adapter put before the model's own code are not the model's: their frames are
    folded away and line numbers count from the model's first line."""

    text: str
    prelude_lines: int = 0

    def line(self, number: int) -> str:
        lines = self.text.splitlines()
        return lines[number - 1].strip() if 0 < number <= len(lines) else ""

    def own(self, number: int) -> int | None:
        """The model's line number for line ``number`` of the script that ran (None: prelude)."""
        return number - self.prelude_lines if number > self.prelude_lines else None


def error_line(stderr: str, reported: int, source: ScriptSource) -> str:
    """`` (line N)`` of the model's code: the traceback's last own frame in ``stderr`` when the
    script is known (the guest's ``reported`` line may be a prelude line), else the guest's
    report (0: not known)."""
    own = [n for n in _frame_lines(stderr) if source.own(n) is not None]
    if own:
        line = source.own(own[-1])
    elif source.prelude_lines:
        line = source.own(reported) if reported else None
    else:
        line = reported or None
    return f" (line {line})" if line else ""


_FRAME = re.compile(r'^  File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<func>.*)$')


def _frame_lines(stderr: str) -> list[int]:
    """Line numbers of the script's frames in the last traceback of ``stderr``."""
    lines: list[int] = []
    for text in stderr.splitlines():
        if text.startswith("Traceback (most recent call last):"):
            lines = []
        match = _FRAME.match(text)
        if match and match["file"] == SCRIPT_FILE:
            lines.append(int(match["line"]))
    return lines


def script_frames(stderr: str, source: ScriptSource) -> str:
    """``stderr`` with every traceback reduced to the script's own frames.

    A frame is the ``File ...`` line and the indented source and caret lines under it. Frames of
    other files (the runtime, the stubs, the standard library) and of an adapter's prelude are
    folded into one marker per run; the script's frames get the model's line numbers and, when
    the script is known, its source line."""
    out: list[str] = []
    hidden = 0
    in_frame = False

    def flush() -> None:
        nonlocal hidden
        if hidden:
            frames = "1 frame" if hidden == 1 else f"{hidden} frames"
            out.append(f"  [... {frames} of the sandbox runtime hidden ...]")
            hidden = 0

    for text in stderr.splitlines():
        match = _FRAME.match(text)
        if match:
            number = int(match["line"])
            own = source.own(number) if match["file"] == SCRIPT_FILE else None
            in_frame = True
            if own is None:
                hidden += 1
                keep_body = False
                continue
            flush()
            keep_body = not source.text
            out.append(f'  File "{SCRIPT_FILE}", line {own}, in {match["func"]}')
            code = source.line(number)
            if code:
                out.append(f"    {code}")
            continue
        if in_frame and text.startswith("    "):
            if keep_body:
                out.append(text)
            continue
        in_frame = False
        flush()
        out.append(text.replace("_ptc_runtime.", "tools.", 1) if _is_exception(text) else text)
    flush()
    return "\n".join(out) + ("\n" if stderr.endswith("\n") else "")


def _is_exception(text: str) -> bool:
    return text.startswith("_ptc_runtime.") and ":" in text
