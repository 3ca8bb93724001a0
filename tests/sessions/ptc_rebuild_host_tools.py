"""A host tool for the session rebuild tests: each call appends a line to the file named by
``PTC_TEST_TALLY``, so a test counts how often the tool really ran (a rebuild answers it from
the record and must not run it again)."""

from __future__ import annotations

import os


def tally(note: str) -> int:
    path = os.environ["PTC_TEST_TALLY"]
    with open(path, "a", encoding="utf-8") as out:
        out.write(note + "\n")
    with open(path, encoding="utf-8") as counted:
        return sum(1 for _ in counted)
