"""A small tmpfs a test mounts (and unmounts however it ends), and a file that fills it: a real
full disk under a real SQLite file, for the tests of an audit store that refuses writes. Needs
root to mount; without it, or where mounting fails, the test skips and says why."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["fill", "small_tmpfs"]


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount -o size=``: "2m") mounted at ``path`` (created)."""
    if os.geteuid() != 0:
        pytest.skip("filling the audit store's filesystem needs root to mount a small tmpfs")
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def fill(directory: Path) -> Path:
    """Writes a file in ``directory`` until its filesystem has no byte left; returns it."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as out:
        for chunk in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    out.write(b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    return filler
