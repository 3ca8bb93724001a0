"""Building a runtime: requirements -> a locked, hashed set of wheels -> an installed tree.

The network is used here and only here (pip, from the package index or from a local wheelhouse
with ``--wheelhouse``, which needs none); a sandbox never downloads anything. Steps, all inside
``<root>/.build-<name>-<random>/``, which is renamed to ``<root>/<name>`` only when everything
passed, and removed on any failure, so nothing half-built is ever visible:

1. ``pip download`` resolves the requirements to binary wheels for the guest's Python;
2. each wheel's sha256 is recorded in ``requirements.lock`` (``name==version --hash=...``);
3. ``pip install --require-hashes --no-index`` installs exactly that set into ``site/``;
4. the guest interpreter compiles the tree (the sandbox cannot write bytecode into it), then
   imports every top-level module of every locked package (one interpreter per package), then
   each ``preload`` module, each time in bubblewrap with a network namespace of its own (nothing
   in it but loopback) and the host's file system read-only;
5. the tree's size is checked against the cap, made readable by any uid, and published.

Before any of it, the runtimes directory is created traversable by any uid (its missing parents
too), and a directory on its path that exists already and that other users cannot traverse
refuses the build, naming it: the sandbox reads a runtime as a uid of its own, so a runtime
built there would fail only at its first execution.

Before it starts, a build deletes what killed builds and removals left behind in the root
(``.build-*``, ``.rm-*``), leaving those a live process still holds (`RuntimeStore`).

The import check of step 4 is what catches a package that needs the network at import: it
would fail in every sandbox, so the build refuses it, naming the package and the module. A
package's top-level modules are read from its ``RECORD`` (a top-level ``.py`` or extension
module, or a directory holding one), so the check covers what the wheel installed, not what
its metadata claims. A top-level module that cannot import offline for another reason (a
dependency the runtime lacks) is refused the same way: the sandbox could not import it
either. Without bubblewrap the check cannot take the network away, so the build refuses to
start (`Unavailable`) rather than check with the host's network or not at all.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from sandbox.errors import InvalidArgument, Unavailable
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
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise Unavailable(
            f"runtime: {name!r}: bubblewrap (bwrap) is not installed, and the build imports "
            "every package without network in it; install it (Debian: apt-get install "
            "bubblewrap); nothing was built"
        )
    version = guest_python_version(python)
    store.make_root(name)  # refuses a root the sandbox's uid cannot reach, before any work
    store.remove_leftovers()
    build, held = store.new_build_dir(name)
    try:
        runtime = _build(
            store, name, text, build, python, version, wheelhouse, preload, max_bytes, bwrap
        )
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    finally:
        os.close(held)
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
    bwrap: str,
) -> Runtime:
    """Locks, installs, compiles and checks a runtime in ``build``, then publishes it in
    ``store`` by one rename: a failure at any step leaves nothing in the store."""
    target = ["--only-binary=:all:"]
    if version != f"{sys.version_info[0]}.{sys.version_info[1]}":
        target += ["--python-version", version]
    packages = _install(name, requirements_text, build, target, wheelhouse, max_bytes)
    site = build / SITE
    _run_guest(name, python, ["-m", "compileall", "-q", "-j", "0", str(site)], "compiling")
    _check_imports(name, bwrap, python, site, preload)
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


def _install(
    name: str,
    requirements_text: str,
    build: Path,
    target: list[str],
    wheelhouse: Path | str | None,
    max_bytes: int,
) -> list[dict[str, str]]:
    """Downloads the wheels, writes the hash-pinned lock, installs from it into the site
    directory (none of the wheels is kept) and returns the locked packages."""
    requirements = build / "requirements.in"
    requirements.write_text(requirements_text, encoding="utf-8")
    wheels = build / "wheels"
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
    return packages


def _check_imports(name: str, bwrap: str, python: str, site: Path, preload: Sequence[str]) -> None:
    """Every installed package, and the preload, must import with no network."""
    for package, modules in _top_level_modules(site).items():
        failed = _import_offline(name, bwrap, python, site, modules, f"package {package}")
        if failed:
            module, detail = failed[0]
            raise InvalidArgument(
                f"requirements: runtime {name!r}: package {package} (module {module}) does not "
                f"import without network: {detail}; nothing was kept"
            )
    if preload:
        failed = _import_offline(name, bwrap, python, site, list(preload), "preload")
        if failed:
            raise InvalidArgument(
                f"preload: runtime {name!r}: importing {', '.join(preload)} without network "
                f"failed: {failed[0][1]}"
            )


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


# Imports each module named in argv[2] (JSON) with argv[1] on sys.path and prints, last, a
# line marked with _MARK listing the failures. os._exit: a module's thread cannot hold it up.
_MARK = "ptc-import-check:"
_IMPORT_CHECK = """
import json, os, sys
sys.path.append(sys.argv[1])
failed = []
for module in json.loads(sys.argv[2]):
    try:
        __import__(module)
    except BaseException as exc:
        failed.append([module, "%s: %s" % (type(exc).__name__, exc)])
sys.stdout.write("\\nptc-import-check:" + json.dumps(failed) + "\\n")
sys.stdout.flush()
os._exit(0)
"""
IMPORT_TIMEOUT_S = 300


def _import_offline(
    name: str, bwrap: str, python: str, site: Path, modules: list[str], what: str
) -> list[tuple[str, str]]:
    """Imports ``modules`` as a sandbox would, isolated and without network; the (module,
    error) pairs that failed. An interpreter that dies before reporting is an error itself."""
    argv = [
        bwrap, "--unshare-user", "--unshare-net", "--ro-bind", "/", "/", "--dev", "/dev",
        "--proc", "/proc", "--die-with-parent", "--",
        python, "-I", "-S", "-c", _IMPORT_CHECK,
        str(site), json.dumps(modules),
    ]  # fmt: skip
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=IMPORT_TIMEOUT_S,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise InvalidArgument(
            f"requirements: runtime {name!r}: {what}: importing {', '.join(modules)} without "
            f"network took longer than {IMPORT_TIMEOUT_S} s; nothing was kept"
        ) from exc
    report = [line for line in proc.stdout.splitlines() if line.startswith(_MARK)]
    if proc.returncode == 0 and report:
        return [(str(m), str(e)) for m, e in json.loads(report[-1][len(_MARK) :])]
    detail = " | ".join(proc.stderr.strip().splitlines()[-4:]) or f"exit status {proc.returncode}"
    if proc.stderr.startswith("bwrap:"):
        raise Unavailable(
            f"runtime: {name!r}: bubblewrap cannot run here, and the build imports every "
            f"package without network in it: {detail}; nothing was built"
        )
    raise InvalidArgument(
        f"requirements: runtime {name!r}: {what}: importing {', '.join(modules)} without "
        f"network ended the interpreter: {detail}; nothing was kept"
    )


def _top_level_modules(site: Path) -> dict[str, list[str]]:
    """``"name version"`` of each installed distribution -> its top-level importable names,
    from its RECORD: a top-level ``.py`` file or extension module, or a top-level directory
    holding one (a package, or a namespace package)."""
    found: dict[str, list[str]] = {}
    for info in sorted(site.glob("*.dist-info")):
        fields = dict(
            line.split(": ", 1)
            for line in (info / "METADATA").read_text(encoding="utf-8").splitlines()
            if ": " in line and not line.startswith(" ")
        )
        names: set[str] = set()
        with (info / "RECORD").open(encoding="utf-8", newline="") as record:
            for row in csv.reader(record):
                path = row[0] if row else ""
                first, _, rest = path.partition("/")
                if not path.endswith((".py", ".so")) or first.endswith((".dist-info", ".data")):
                    continue
                module = first if rest else first.split(".", 1)[0]
                if module.isidentifier() and module != "__pycache__":
                    names.add(module)
        if names:
            found[f"{fields.get('Name', info.name)} {fields.get('Version', '?')}"] = sorted(names)
    return found


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
