"""`ptc run --backend docker` where the Docker SDK cannot be imported: a one-line error that
names the extra to install, the exit code of `Unavailable`, no traceback. Needs no engine: a `docker` module that
fails to import shadows the installed SDK."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandbox.errors import Unavailable


def test_missing_sdk_names_the_extra(tmp_path: Path, ptc: Any) -> None:
    (tmp_path / "docker.py").write_text("raise ImportError('No module named docker (test)')\n")
    done = ptc(
        "run", "-", "--backend", "docker", "--json",
        stdin="print(1)",
        env={"PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (Unavailable.exit_code, "")
    assert done.stderr == (
        "ptc run: unavailable: the Docker backend needs the Docker SDK, which is not installed: "
        "pip install 'ptc-sandbox[docker]' (ImportError: No module named docker (test))\n"
    )
    # The same command line without the shadowing module still parses and runs on the process
    # backend: the shim is what made the SDK unimportable.
    assert ptc("run", "-", "--json", stdin="print(1)").returncode == 0
