"""`ptc runtime build|list|show|rm` on real packages: a locked, hashed set; bad input refused
with a clear error and nothing half-built left behind."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.runtimes.runtime_support import PYTHON, ROOT, ptc, world_traversable_dir


@pytest.fixture
def scratch() -> Iterator[Path]:
    """An empty runtimes directory of this test's own."""
    root = world_traversable_dir("ptcrt-scratch-")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_built_runtime_is_locked_hashed_and_readable(runtimes_dir: Path) -> None:
    listed = ptc("runtime", "--dir", str(runtimes_dir), "list")
    assert listed.returncode == 0, listed.stderr
    assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == ["np", "pure"]
    shown = ptc("runtime", "--dir", str(runtimes_dir), "show", "np")
    assert shown.returncode == 0, shown.stderr
    meta = json.loads(shown.stdout)
    assert meta["name"] == "np" and meta["python"] == "3.11" and meta["abi"] == "cp311"
    assert meta["preload"] == ["numpy"]
    assert sorted(p["name"] for p in meta["packages"]) == ["numpy", "six"]
    for package in meta["packages"]:
        assert re.fullmatch(r"[0-9a-f]{64}", package["sha256"]), package
        assert package["wheel"].endswith(".whl")
    lock = (runtimes_dir / "np" / "requirements.lock").read_text().splitlines()
    assert sorted(lock) == sorted(
        f"{p['name']}=={p['version']} --hash=sha256:{p['sha256']}" for p in meta["packages"]
    )
    site = runtimes_dir / "np" / "site"
    assert (site / "numpy" / "__init__.py").is_file()
    assert stat.S_IMODE(site.stat().st_mode) == 0o755
    # Compiled at build time: the sandbox cannot write bytecode into its read-only runtime.
    assert list((site / "numpy" / "__pycache__").glob("__init__.cpython-311.pyc"))
    assert not (runtimes_dir / "np" / "wheels").exists()
    assert _entries(runtimes_dir) == ["np", "pure"]  # no build left over


def test_offline_build_from_a_wheelhouse_and_rm(scratch: Path, tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheels"
    subprocess.run(
        [PYTHON, "-m", "pip", "download", "-q", "six==1.17.0", "-d", str(wheelhouse),
         "--only-binary=:all:"],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    requirements = tmp_path / "req.txt"
    requirements.write_text("six==1.17.0\n")
    built = ptc(
        "runtime", "--dir", str(scratch), "build", "offline",
        "-r", str(requirements), "--wheelhouse", str(wheelhouse),
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert built.stdout.startswith("offline: python 3.11, ") and built.stdout.endswith(
        "bytes: six==1.17.0\n"
    ), built.stdout
    again = ptc("runtime", "--dir", str(scratch), "build", "offline", "-r", str(requirements))
    assert again.returncode == 2
    assert again.stderr == (
        f"ptc runtime: runtime: 'offline' already exists in {scratch}; runtimes are immutable "
        "(`ptc runtime rm offline` first)\n"
    )
    removed = ptc("runtime", "--dir", str(scratch), "rm", "offline")
    assert removed.returncode == 0, removed.stderr
    assert _entries(scratch) == []
    missing = ptc("runtime", "--dir", str(scratch), "rm", "offline")
    assert missing.returncode == 8
    assert missing.stderr == (
        f"ptc runtime: not found: runtime: no runtime named 'offline' in {scratch} (have: none)\n"
    )


def test_unresolvable_requirements_leave_nothing(scratch: Path, tmp_path: Path) -> None:
    requirements = tmp_path / "req.txt"
    requirements.write_text("ptc-no-such-package-0f9e8d7c==0.0.1\n")
    done = ptc("runtime", "--dir", str(scratch), "build", "bad", "-r", str(requirements))
    assert done.returncode == 2
    assert done.stderr.startswith(
        "ptc runtime: requirements: runtime 'bad': pip download failed: "
    ), done.stderr
    assert "ptc-no-such-package-0f9e8d7c" in done.stderr
    assert _entries(scratch) == []


def test_a_wheelhouse_without_the_package_is_an_error(scratch: Path, tmp_path: Path) -> None:
    requirements = tmp_path / "req.txt"
    requirements.write_text("six\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    done = ptc(
        "runtime", "--dir", str(scratch), "build", "nowheel",
        "-r", str(requirements), "--wheelhouse", str(empty),
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith("ptc runtime: requirements: runtime 'nowheel': pip download")
    assert _entries(scratch) == []


@pytest.mark.parametrize(
    "name", ["../escape", "a/b", ".hidden", "..", "UPPER", "", "x" * 65], ids=repr
)
def test_bad_names_are_refused(scratch: Path, tmp_path: Path, name: str) -> None:
    requirements = tmp_path / "req.txt"
    requirements.write_text("six\n")
    done = ptc("runtime", "--dir", str(scratch), "build", name, "-r", str(requirements))
    assert done.returncode == 2
    assert done.stderr == (
        f"ptc runtime: runtime: {name!r} is not a valid runtime name (1-64 of [a-z0-9._-], "
        "starting with a letter or digit, no '..')\n"
    )
    assert _entries(scratch) == []
    assert not (scratch.parent / "escape").exists()


def test_too_large_is_refused_and_removed(scratch: Path, tmp_path: Path) -> None:
    requirements = tmp_path / "req.txt"
    requirements.write_text("six==1.17.0\n")
    # The wheel (11 kB) fits; the installed tree (source, metadata, bytecode) does not.
    done = ptc(
        "runtime", "--dir", str(scratch), "build", "big",
        "-r", str(requirements), "--max-bytes", "20000",
    )  # fmt: skip
    assert done.returncode == 2
    assert re.fullmatch(
        r"ptc runtime: runtime: 'big': installed size \d+ bytes is over the cap of 20000 bytes "
        r"\(--max-bytes\); nothing was kept\n",
        done.stderr,
    ), done.stderr
    assert _entries(scratch) == []


def test_a_preload_that_does_not_import_is_refused(scratch: Path, tmp_path: Path) -> None:
    requirements = tmp_path / "req.txt"
    requirements.write_text("six==1.17.0\n")
    done = ptc(
        "runtime", "--dir", str(scratch), "build", "nopre",
        "-r", str(requirements), "--preload", "numpy",
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith(
        "ptc runtime: preload: runtime 'nopre': importing numpy without network failed: "
    ), done.stderr
    assert "ModuleNotFoundError: No module named 'numpy'" in done.stderr
    assert _entries(scratch) == []


def _wheel(wheelhouse: Path, project: str, version: str, modules: dict[str, str]) -> Path:
    """A pure-Python wheel, written here (no build backend, no network): top-level ``modules``
    (file name -> source) and its dist-info, with a RECORD pip accepts."""
    dist = f"{project.replace('-', '_')}-{version}"
    files = {
        **modules,
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: ptc-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for path, text in files.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    wheelhouse.mkdir(exist_ok=True)
    wheel = wheelhouse / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
        archive.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    return wheel


# TEST-NET-1 (RFC 5737): never routed. Offline the connect fails at once (no route); with the
# host's network it would wait for the timeout instead.
NETWORK_AT_IMPORT = (
    "import socket\nsocket.create_connection(('192.0.2.1', 80), timeout=5).close()\nANSWER = 42\n"
)


def test_a_package_that_needs_the_network_at_import_is_refused(
    scratch: Path, tmp_path: Path
) -> None:
    wheelhouse = tmp_path / "wheels"
    # Only a second top-level module of the package opens the socket: every one is checked.
    _wheel(
        wheelhouse,
        "ptc-netimport",
        "0.1",
        {"ptc_quiet.py": "ANSWER = 1\n", "ptc_phone_home/__init__.py": NETWORK_AT_IMPORT},
    )
    requirements = tmp_path / "req.txt"
    requirements.write_text("ptc-netimport==0.1\n")
    done = ptc(
        "runtime", "--dir", str(scratch), "build", "net",
        "-r", str(requirements), "--wheelhouse", str(wheelhouse),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "ptc runtime: requirements: runtime 'net': package ptc-netimport 0.1 (module "
        "ptc_phone_home) does not import without network: OSError: [Errno 101] Network is "
        "unreachable; nothing was kept\n"
    )
    assert _entries(scratch) == []


def test_a_package_that_imports_offline_is_built(scratch: Path, tmp_path: Path) -> None:
    # Just under: the same package opening no connection at import builds and is locked.
    wheelhouse = tmp_path / "wheels"
    quiet = "import socket\nANSWER = 42\n"
    _wheel(wheelhouse, "ptc-netimport", "0.1", {"ptc_phone_home/__init__.py": quiet})
    requirements = tmp_path / "req.txt"
    requirements.write_text("ptc-netimport==0.1\n")
    done = ptc(
        "runtime", "--dir", str(scratch), "build", "quiet",
        "-r", str(requirements), "--wheelhouse", str(wheelhouse),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith(" bytes: ptc-netimport==0.1\n"), done.stdout
    assert _entries(scratch) == ["quiet"]


def test_without_bubblewrap_the_build_is_refused(scratch: Path, tmp_path: Path) -> None:
    # No bwrap on PATH: the build cannot take the network away from the import check, so it
    # refuses before downloading anything rather than check with the network, or not at all.
    wheelhouse = tmp_path / "wheels"
    _wheel(wheelhouse, "ptc-netimport", "0.1", {"ptc_phone_home/__init__.py": "ANSWER = 1\n"})
    requirements = tmp_path / "req.txt"
    requirements.write_text("ptc-netimport==0.1\n")
    empty = tmp_path / "bin"
    empty.mkdir()
    done = ptc(
        "runtime", "--dir", str(scratch), "build", "nobwrap",
        "-r", str(requirements), "--wheelhouse", str(wheelhouse),
        env={**os.environ, "PATH": str(empty)},
    )  # fmt: skip
    assert done.returncode == 12, done.stderr
    assert done.stderr == (
        "ptc runtime: unavailable: runtime: 'nobwrap': bubblewrap (bwrap) is not installed, and "
        "the build imports every package without network in it; install it (Debian: apt-get "
        "install bubblewrap); nothing was built\n"
    )
    assert _entries(scratch) == []


def _wait_for(what: str, predicate: Any, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _cmdline(process: psutil.Process) -> str:
    """Its command line, or "" for one that ended meanwhile (the build's short-lived pip and
    compile children end while the test looks; a zombie has no command line left)."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def test_leftovers_of_killed_builds_are_removed_and_live_builds_kept(
    scratch: Path, tmp_path: Path
) -> None:
    wheelhouse = tmp_path / "wheels"
    # Its import check takes two minutes: the build is caught (and killed) in the middle.
    _wheel(wheelhouse, "ptc-slow", "0.1", {"ptc_slow.py": "import time\ntime.sleep(120)\n"})
    _wheel(wheelhouse, "ptc-quick", "0.1", {"ptc_quick.py": "ANSWER = 1\n"})
    (tmp_path / "slow.txt").write_text("ptc-slow==0.1\n")
    (tmp_path / "quick.txt").write_text("ptc-quick==0.1\n")

    def build(name: str, req: str) -> list[str]:
        return [
            PYTHON, "-m", "sandbox.cli", "runtime", "--dir", str(scratch), "build", name,
            "-r", str(tmp_path / req), "--wheelhouse", str(wheelhouse),
        ]  # fmt: skip

    slow = subprocess.Popen(
        build("slow", "slow.txt"), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    helpers: list[psutil.Process] = []
    try:
        builder = psutil.Process(slow.pid)
        helpers = _wait_for(
            "the slow build's import check",
            lambda: [
                p for p in builder.children(recursive=True)
                if "ptc-import-check" in _cmdline(p)
            ],
        )  # fmt: skip
        helpers = builder.children(recursive=True)
        (in_progress,) = scratch.glob(".build-slow-*")
        # What a build and a removal killed earlier left behind: nobody holds them.
        for leftover in (".build-old-0a1b2c3d", ".rm-gone-4242"):
            (scratch / leftover / "site").mkdir(parents=True)
            (scratch / leftover / "site" / "mod.py").write_text("x = 1\n")

        # A second build at the same time removes the leftovers, not the build at work.
        quick = subprocess.run(
            build("quick", "quick.txt"), cwd=ROOT, capture_output=True, text=True, timeout=110
        )
        assert quick.returncode == 0, quick.stderr
        assert _entries(scratch) == [in_progress.name, "quick"]
        assert (in_progress / "site" / "ptc_slow.py").is_file()

        # Killed (the builder alone, as the OOM killer would): its directory stays behind...
        slow.send_signal(signal.SIGKILL)
        assert slow.wait(timeout=30) == -signal.SIGKILL
        _, alive = psutil.wait_procs(helpers, timeout=30)
        assert alive == [], alive  # bwrap --die-with-parent took the import check with it
        assert _entries(scratch) == [in_progress.name, "quick"]
        # ...until the next build, which finds nobody holding it.
        again = subprocess.run(
            build("again", "quick.txt"), cwd=ROOT, capture_output=True, text=True, timeout=110
        )
        assert again.returncode == 0, again.stderr
        assert _entries(scratch) == ["again", "quick"]
    finally:
        if slow.poll() is None:
            slow.kill()
            slow.wait(timeout=30)
        for helper in helpers:
            if helper.is_running():
                helper.kill()
        assert slow.stderr is not None
        slow.stderr.close()
