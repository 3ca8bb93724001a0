"""The wheel: built from a copy of the sources, offline, and looked into.

It must carry the gRPC contract the README points users to (at its import path inside the
package), the license file, SPDX license metadata (the `license = "..."` string form), and the
zygote's fork loop in C, built (`sandbox/guest/forkloop.c`; the test machine has a compiler).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO = "ptc/sandbox/v1/sandbox.proto"


def test_the_wheel_ships_the_proto_and_the_license(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")  # the build makes its own
    for package in ("sandbox", "stubs_gen"):
        shutil.copytree(ROOT / package, source / package, ignore=ignore)
    out = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "--wheel-dir", str(out), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    [wheel] = list(out.glob("ptc_sandbox-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert f"sandbox/_proto/{PROTO}" in names
        # The zygote's fork loop in C, built by the wheel's build (a C compiler is there).
        built = [
            n for n in names if n.startswith("sandbox/guest/libforkloop") and n.endswith(".so")
        ]
        assert len(built) == 1, sorted(n for n in names if n.startswith("sandbox/guest/"))
        shipped = archive.read(f"sandbox/_proto/{PROTO}").decode()
        [dist_info] = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        assert f"{dist_info}/licenses/LICENSE" in names
        license_text = archive.read(f"{dist_info}/licenses/LICENSE").decode()
        metadata = archive.read(f"{dist_info}/METADATA").decode()
    assert shipped == (ROOT / "proto" / PROTO).read_text()
    assert "package ptc.sandbox.v1;" in shipped
    assert license_text == (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    headers = metadata.split("\n\n", 1)[0].splitlines()
    assert "License-Expression: Apache-2.0" in headers
    assert "License-File: LICENSE" in headers
    assert not any(h.startswith("License: ") for h in headers)
