"""Runtimes built once per test session, from scratch, with real packages from the index.

``np``: numpy (preloaded by its fork server) and six; ``pure``: six only (a pure-Python package,
nothing preloaded). Both are built by the real command line (`ptc runtime build`) into a fresh
directory that the sandbox uid can traverse (the sandbox reads its runtime as that uid), and the
directory is removed at the end of the session.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runtimes.runtime_support import ptc, world_traversable_dir


@pytest.fixture(scope="session")
def runtimes_dir() -> Iterator[Path]:
    root = world_traversable_dir("ptcrt-test-")
    inputs = Path(tempfile.mkdtemp(prefix="ptcrt-in-"))
    try:
        (inputs / "np.txt").write_text("numpy\nsix\n")
        (inputs / "pure.txt").write_text("six\n")
        for name, extra in (("np", ["--preload", "numpy"]), ("pure", [])):
            done = ptc(
                "runtime", "--dir", str(root), "build", name,
                "--requirements", str(inputs / f"{name}.txt"), *extra,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(inputs, ignore_errors=True)


@pytest.fixture(scope="session")
def runtimes_env(runtimes_dir: Path) -> dict[str, str]:
    """The environment for a `ptc` subprocess that finds the session's runtimes."""
    return {**os.environ, "PTC_RUNTIMES_DIR": str(runtimes_dir)}
