"""Reading a tool manifest named on the command line (`--tools MANIFEST`, `ptc stubs MANIFEST`).

A manifest file of zero bytes (or only whitespace) is almost always a mistake, typically a
redirect that failed (`tool-export > tools.json` whose producer died), and must not run a script
as if it had no tools: it is refused naming the file. A manifest with no tools is written `[]`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sandbox.errors import InvalidArgument

__all__ = ["read_manifest"]


def read_manifest(path: str, option: str = "--tools") -> str:
    """The text of the manifest at ``path`` (``-``: standard input); `InvalidArgument` naming
    ``option`` and the file when it cannot be read, is not UTF-8, or holds nothing."""
    where = "standard input" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"{option} {where}: {exc}") from exc
    if not text.strip():
        size = len(text.encode("utf-8"))
        what = "0 bytes" if not size else f"{size} bytes of whitespace only"
        raise InvalidArgument(
            f"{option} {where}: the manifest is empty ({what}); "
            "a manifest with no tools is written []"
        )
    return text
