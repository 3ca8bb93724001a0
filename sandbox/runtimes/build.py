"""Building a runtime: requirements -> a locked, hashed set of wheels -> an installed tree.

The network is used here and only here (pip, from the package index or from a local wheelhouse
with ``--wheelhouse``, which needs none); a sandbox never downloads anything. Steps, all inside
``<root>/.build-<name>-<random>/``, which is renamed to ``<root>/<name>`` only when everything
passed, and removed on any failure, so nothing half-built is ever visible:

1. ``pip download`` resolves the requirements to binary wheels for the guest's Python;
2. each wheel's sha256 is recorded in ``requirements.lock`` (``name==version --hash=...``);
3. ``pip install --require-hashes --no-index`` installs exactly that set into ``site/``;
4. the guest interpreter compiles the tree (the sandbox cannot write bytecode into it) and
   imports each ``preload`` module in a network namespace with nothing in it;
5. the tree's size is checked against the cap, made readable by any uid, and published.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from sandbox.errors import InvalidArgument
from sandbox.runtimes.store import METADATA, SITE, Runtime, RuntimeStore, validate_name

__all__ = ["DEFAULT_MAX_BYTES", "build_runtime", "guest_python_version"]

DEFAULT_MAX_BYTES = 1 << 30
PIP_TIMEOUT_S = 900
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_PIP_ENV = {
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PIP_NO_INPUT": "1",
    "PIP_NO_CACHE_DIR": "1",
}


def guest_python_version(python: str) -> str:
    """ "3.11" for the interpreter at ``python``."""
    out = subprocess.run(
        [python, "-I", "-S", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.strip()


def build_runtime(
    store: RuntimeStore,
    name: str,
    requirements: Path | str,
    *,
    python: str,
    wheelhouse: Path | str | None = None,
    preload: Sequence[str] = (),
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Runtime:
    """Builds runtime ``name`` for the guest interpreter ``python``; `InvalidArgument` on any
    bad input, with nothing left behind."""
    validate_name(name)
    if (store.root / name).exists():
        raise InvalidArgument(
            f"runtime: {name!r} already exists in {store.root}; runtimes are immutable "
            f"(`ptc runtime rm {name}` first)"
        )
    try:
        text = Path(requirements).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"requirements: cannot read {requirements}: {exc}") from exc
    for module in preload:
        if not _MODULE.fullmatch(module):
            raise InvalidArgument(f"preload: {module!r} is not a module name")
    if wheelhouse is not None and not Path(wheelhouse).is_dir():
        raise InvalidArgument(f"wheelhouse: {wheelhouse} is not a directory")
    if max_bytes <= 0:
        raise InvalidArgument(f"max_bytes: must be positive, got {max_bytes}")
    version = guest_python_version(python)
    store.root.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".build-{name}-", dir=store.root))
    try:
        runtime = _build(store, name, text, build, python, version, wheelhouse, preload, max_bytes)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    return runtime


def _build(
    store: RuntimeStore,
    name: str,
    requirements_text: str,
    build: Path,
    python: str,
    version: str,
    wheelhouse: Path | str | None,
    preload: Sequence[str],
    max_bytes: int,
) -> Runtime:
    requirements = build / "requirements.in"
    requirements.write_text(requirements_text, encoding="utf-8")
    wheels = build / "wheels"
    target = ["--only-binary=:all:"]
    if version != f"{sys.version_info[0]}.{sys.version_info[1]}":
        target += ["--python-version", version]
    sources = ["--no-index", "--find-links", str(wheelhouse)] if wheelhouse is not None else []
    wheels.mkdir()
    _pip(name, "download", "-r", str(requirements), "--dest", str(wheels), *target, *sources)
    packages = _lock(wheels)
    wheel_bytes = sum(p.stat().st_size for p in wheels.iterdir())
    if wheel_bytes > max_bytes:
        raise _too_large(name, wheel_bytes, max_bytes, "downloaded wheels")
    lock = build / "requirements.lock"
    lock.write_text(
        "".join(f"{p['name']}=={p['version']} --hash=sha256:{p['sha256']}\n" for p in packages),
        encoding="utf-8",
    )
    site = build / SITE
    if packages:
        _pip(
            name, "install", "--no-index", "--find-links", str(wheels), "--require-hashes",
            "--no-deps", "--no-compile", "--target", str(site), "-r", str(lock), *target,
        )  # fmt: skip
    shutil.rmtree(wheels)
    site.mkdir(exist_ok=True)  # an empty requirements file still makes a (bare) runtime
    _run_guest(name, python, ["-m", "compileall", "-q", "-j", "0", str(site)], "compiling")
    if preload:
        _check_preload(name, python, site, preload)
    size = _tree_bytes(build)
    if size > max_bytes:
        raise _too_large(name, size, max_bytes, "installed")
    metadata = {
        "name": name,
        "python": version,
        "abi": "cp" + version.replace(".", ""),
        "packages": packages,
        "preload": list(preload),
        "size_bytes": size,
        "requirements": requirements_text,
    }
    (build / METADATA).write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf-8")
    _make_readable(build)
    try:
        os.rename(build, store.root / name)
    except OSError as exc:  # built twice at once: the other one won
        raise InvalidArgument(f"runtime: {name!r} could not be published: {exc}") from exc
    return store.get(name)


def _pip(name: str, *args: str) -> None:
    argv = [sys.executable, "-m", "pip", args[0], "--quiet", "--timeout", "30", *args[1:]]
    env = {**os.environ, **_PIP_ENV}
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, env=env, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise InvalidArgument(
            f"runtime: {name!r}: pip {args[0]} took longer than {PIP_TIMEOUT_S} s"
        ) from exc
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        detail = " | ".join(lines[-6:]) or f"exit status {proc.returncode}"
        raise InvalidArgument(f"requirements: runtime {name!r}: pip {args[0]} failed: {detail}")


def _lock(wheels: Path) -> list[dict[str, str]]:
    packages = []
    for wheel in sorted(wheels.iterdir()):
        try:
            project, version, _build_tag, _tags = parse_wheel_filename(wheel.name)
        except InvalidWheelFilename as exc:
            raise InvalidArgument(f"requirements: {wheel.name} is not a wheel: {exc}") from exc
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        packages.append(
            {"name": str(project), "version": str(version), "wheel": wheel.name, "sha256": digest}
        )
    return packages


def _run_guest(name: str, python: str, args: list[str], what: str) -> None:
    proc = subprocess.run(
        [python, "-I", "-S", *args],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        check=False,
    )
    if proc.returncode != 0:
        detail = " | ".join(proc.stderr.strip().splitlines()[-4:])
        raise InvalidArgument(f"runtime: {name!r}: {what} failed: {detail}")


def _check_preload(name: str, python: str, site: Path, preload: Sequence[str]) -> None:
    """Imports every preload module as the fork server will: isolated, no network."""
    code = f"import sys; sys.path.append({str(site)!r})\n" + "".join(
        f"import {module}\n" for module in preload
    )
    bwrap = shutil.which("bwrap")
    argv = [python, "-I", "-S", "-c", code]
    if bwrap is not None:
        # Any network access at import is a failure here, as it would be in the sandbox.
        argv = [
            bwrap, "--unshare-user", "--unshare-net", "--ro-bind", "/", "/", "--dev", "/dev",
            "--proc", "/proc", "--die-with-parent", "--", *argv,
        ]  # fmt: skip
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        check=False,
    )
    if proc.returncode != 0:
        detail = " | ".join(proc.stderr.strip().splitlines()[-4:])
        raise InvalidArgument(
            f"preload: runtime {name!r}: importing {', '.join(preload)} without network "
            f"failed: {detail}"
        )


def _tree_bytes(root: Path) -> int:
    total = 0
    for directory, _dirs, files in os.walk(root):
        for file in files:
            total += os.lstat(os.path.join(directory, file)).st_size
    return total


def _too_large(name: str, size: int, cap: int, what: str) -> InvalidArgument:
    return InvalidArgument(
        f"runtime: {name!r}: {what} size {size} bytes is over the cap of {cap} bytes "
        "(--max-bytes); nothing was kept"
    )


def _make_readable(root: Path) -> None:
    """Readable (and directories enterable) by any uid: the sandbox reads the tree as nobody."""
    for directory, dirs, files in os.walk(root):
        os.chmod(directory, 0o755)  # noqa: S103  (the sandbox uid must read it)
        for file in files:
            path = os.path.join(directory, file)
            if not os.path.islink(path):
                mode = os.lstat(path).st_mode
                os.chmod(path, 0o755 if mode & 0o111 else 0o644)
        del dirs  # walked next by os.walk
