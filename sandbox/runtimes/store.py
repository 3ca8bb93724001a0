"""The runtimes directory: named, immutable Python environments that sandboxes run in.

A runtime is a directory ``<root>/<name>/`` holding ``runtime.json`` (what it is and what it
was built for) and ``site/`` (the installed packages, imported from the sandbox's read-only
view of it). Runtimes are never changed in place: ``ptc runtime rm`` then ``build`` again. The
default runtime (no name, or ``default``) is the bare standard library and has no directory.

Names are 1-64 of ``[a-z0-9._-]`` starting with a letter or digit, so a name can never leave
the root (no ``/``, no ``..``) nor hide a build in progress (``.build-*``).

Work in progress lives in hidden directories: a build in ``.build-<name>-<random>/``, a removal
in ``.rm-<name>-<pid>/``. The process doing the work holds an exclusive `flock` on the directory
for as long as it works, so the kernel releases it when that process ends, however it ends; a
hidden directory nobody holds is the leftover of a killed build or removal, and
`RuntimeStore.remove_leftovers` deletes it (``build_runtime`` calls it first). Creating and
locking a build directory happens under the root's own lock (a flock on the root), so a concurrent
clean-up can never take a directory in the instant between its creation and its lock.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.errors import InvalidArgument, NotFound

__all__ = [
    "DEFAULT_RUNTIME",
    "Runtime",
    "RuntimeStore",
    "default_runtimes_dir",
    "validate_name",
]

DEFAULT_RUNTIME = "default"
METADATA = "runtime.json"
SITE = "site"
# Where a runtime's tree appears inside a sandbox (read-only); its packages are in site/.
MOUNT_POINT = "/ptc-runtime"
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_LEFTOVER = re.compile(r"\.(build|rm)-.+")


def validate_name(name: str) -> str:
    """``name`` when it is a valid runtime name; else `InvalidArgument` naming the rule."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise InvalidArgument(
            f"runtime: {name!r} is not a valid runtime name (1-64 of [a-z0-9._-], starting "
            "with a letter or digit, no '..')"
        )
    return name


def default_runtimes_dir() -> Path:
    """``$PTC_RUNTIMES_DIR``, else /var/lib/ptc/runtimes for root, else a per-user directory.
    Its path must be traversable by the sandbox uid (the sandbox reads the runtime as it)."""
    configured = os.environ.get("PTC_RUNTIMES_DIR")
    if configured:
        return Path(configured)
    if os.getuid() == 0:
        return Path("/var/lib/ptc/runtimes")
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "ptc" / "runtimes"


@dataclass(frozen=True)
class Runtime:
    """One built runtime, as its ``runtime.json`` describes it."""

    name: str
    path: Path
    python: str  # "3.11": the interpreter version it was built for
    abi: str  # "cp311"
    packages: tuple[dict[str, str], ...]  # name, version, wheel, sha256 (the locked set)
    preload: tuple[str, ...]  # modules the fork server imports once, before forking
    size_bytes: int
    requirements: str  # the requirements file as given

    @property
    def site(self) -> Path:
        return self.path / SITE

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.path),
            "python": self.python,
            "abi": self.abi,
            "packages": list(self.packages),
            "preload": list(self.preload),
            "size_bytes": self.size_bytes,
            "requirements": self.requirements,
        }


class RuntimeStore:
    """The runtimes under one root directory."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else default_runtimes_dir()

    def path(self, name: str) -> Path:
        return self.root / validate_name(name)

    def exists(self, name: str) -> bool:
        """Whether runtime ``name`` is built here (a valid name; `InvalidArgument` otherwise)."""
        return (self.path(name) / METADATA).is_file()

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            entry.name
            for entry in self.root.iterdir()
            if _NAME.fullmatch(entry.name) and (entry / METADATA).is_file()
        )

    def get(self, name: str) -> Runtime:
        """The runtime called ``name``; `NotFound` naming the root and what it has."""
        path = self.path(name)
        try:
            data = json.loads((path / METADATA).read_text(encoding="utf-8"))
        except FileNotFoundError:
            have = ", ".join(self.names()) or "none"
            raise NotFound(
                f"runtime: no runtime named {name!r} in {self.root} (have: {have})"
            ) from None
        except (OSError, ValueError) as exc:
            raise NotFound(f"runtime: {name!r} in {self.root} is unreadable: {exc}") from exc
        return Runtime(
            name=name,
            path=path,
            python=str(data["python"]),
            abi=str(data["abi"]),
            packages=tuple(dict(p) for p in data.get("packages", [])),
            preload=tuple(str(m) for m in data.get("preload", [])),
            size_bytes=int(data.get("size_bytes", 0)),
            requirements=str(data.get("requirements", "")),
        )

    def list(self) -> list[Runtime]:
        return [self.get(name) for name in self.names()]

    def remove(self, name: str) -> None:
        path = self.path(name)
        if not (path / METADATA).is_file():
            self.get(name)  # raises NotFound with the list
        # Held before the rename, so that no clean-up takes the .rm- directory for a leftover;
        # renamed first so that a sandbox starting now finds it gone, not half-deleted.
        try:
            held = _hold(path, block=True)
        except FileNotFoundError:
            self.get(name)  # removed by another meanwhile: NotFound
            raise
        try:
            doomed = self.root / f".rm-{name}-{os.getpid()}"
            os.rename(path, doomed)
            shutil.rmtree(doomed)
        finally:
            os.close(held)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The root's own lock (a flock on the root directory: no file of its own)."""
        fd = _hold(self.root, block=True)
        try:
            yield
        finally:
            os.close(fd)

    def make_root(self, name: str) -> None:
        """Creates the root (and its missing parents) traversable by any uid, as the sandbox
        reads a runtime as a uid of its own; `InvalidArgument` naming the directory when one on
        the way that exists already is not (a runtime built there could never run)."""
        root = Path(os.path.abspath(self.root))
        existing = root
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        blocked = untraversable(existing)
        if blocked is not None:
            try:
                mode = f" (mode {stat.S_IMODE(blocked.stat().st_mode):04o})"
            except OSError:
                mode = ""
            raise InvalidArgument(
                f"runtime: {name!r}: {blocked}{mode} cannot be traversed by other users, and a "
                f"sandbox reads its runtime as a uid of its own: a runtime in {root} could never "
                f"run; make it traversable (chmod o+x {blocked}) or build into a directory that "
                "is (--dir or $PTC_RUNTIMES_DIR); nothing was built"
            )
        missing = [root, *root.parents]
        missing = missing[: missing.index(existing)]
        try:
            for path in reversed(missing):
                path.mkdir()
                path.chmod(0o755)  # not left to the umask: the sandbox's uid must traverse it
            if not root.is_dir():
                raise NotADirectoryError(f"{root} is not a directory")
        except OSError as exc:
            raise InvalidArgument(f"runtime: {name!r}: cannot use {root}: {exc}") from exc

    def new_build_dir(self, name: str) -> tuple[Path, int]:
        """A fresh ``.build-<name>-<random>/`` and the fd that holds it (close it when done)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with self._locked():
            path = Path(tempfile.mkdtemp(prefix=f".build-{name}-", dir=self.root))
            return path, _hold(path, block=False)

    def remove_leftovers(self) -> tuple[Path, ...]:
        """Deletes the ``.build-*`` and ``.rm-*`` directories that no live process holds (the
        leftovers of killed builds and removals); the paths deleted."""
        if not self.root.is_dir():
            return ()
        taken: builtins.list[tuple[Path, int]] = []  # `list` here is the method below
        with self._locked():
            for entry in sorted(self.root.iterdir()):
                if not _LEFTOVER.fullmatch(entry.name):
                    continue
                try:
                    taken.append((entry, _hold(entry, block=False)))
                except BlockingIOError:
                    continue  # a build or removal at work
                except OSError:
                    continue  # not a directory (or gone): not ours to judge
        # Deleted outside the root's lock (a large tree takes a while), still held: another
        # clean-up skips them, and one killed half-way leaves them unheld for the next.
        for path, fd in taken:
            try:
                shutil.rmtree(path)
            finally:
                os.close(fd)
        return tuple(path for path, _fd in taken)

    def check_for(self, name: str, python_version: str) -> Runtime:
        """The runtime, when it was built for ``python_version`` ("3.11") and its tree is
        readable by any uid; else a clear error (before any sandbox is taken)."""
        runtime = self.get(name)
        if runtime.python != python_version:
            raise InvalidArgument(
                f"runtime: {name!r} was built for Python {runtime.python}, but the sandbox runs "
                f"Python {python_version}; rebuild it (`ptc runtime rm {name}` then "
                f"`ptc runtime build {name} ...`)"
            )
        blocked = untraversable(runtime.site)
        if blocked is not None:
            raise InvalidArgument(
                f"runtime: {name!r}: {blocked} is not readable by other users, so the sandbox's "
                "uid cannot see the runtime; make the runtimes directory world-traversable"
            )
        return runtime


def _hold(path: Path, *, block: bool) -> int:
    """An fd on directory ``path`` with an exclusive flock: the directory is in use until the
    fd is closed or its process ends. `BlockingIOError` when another holds it and not
    ``block``."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
    except BaseException:
        os.close(fd)
        raise
    return fd


def untraversable(path: Path) -> Path | None:
    """The first directory on ``path`` (from /) that others may not enter, if any."""
    current = Path("/")
    for part in path.resolve().parts[1:]:
        current = current / part
        try:
            mode = current.stat().st_mode
        except OSError:
            return current
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            return current
    return None
