"""Helpers for the runtime tests: the `ptc` command line, a directory the sandbox uid can read."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.ptc_cli import run_ptc

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable


def ptc(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`run_ptc` with room for a runtime's build (minutes on a small machine)."""
    return run_ptc(*args, env=env, timeout=900)


def world_traversable_dir(prefix: str) -> Path:
    """A fresh directory under /tmp (pytest's own are private to root, 0700)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    return path


def _root_conftest() -> Any:
    """tests/conftest.py (its `EngineHarness`), which this package's own conftest shadows as
    the module named ``conftest``."""
    name = "ptc_tests_root_conftest"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "conftest.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


EngineHarness = _root_conftest().EngineHarness
