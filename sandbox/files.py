"""Files in and out of an execution: names, the request's input files, the returned outputs.

A request may carry input files (`InputFile`: a name and its bytes). The guest writes them into
the script's working directory before the script starts, mode 0444 (see SECURITY.md for what
read-only means on each backend). Files the script writes under ``outputs/`` come back as
`OutputFile`s (name relative to ``outputs/``, size, sha256, bytes); a file that is not returned
is listed as an `OmittedOutput` saying why, with its size, never dropped silently.

A name is a relative POSIX path: components of 1..255 bytes joined by ``/``, at most
`MAX_NAME_BYTES` in all, no empty, ``.`` or ``..`` component, no leading ``/``, no NUL or other
control character, no backslash. Input names may not lie under ``outputs/`` and may not repeat or
nest under one another. Limits (`input_files`, `input_bytes`, `output_files`,
`output_file_bytes`, `output_bytes`) are those of `sandbox.limits`, checked once by
`check_inputs` for inputs and by `sandbox.execution.outputs` for outputs.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.errors import InvalidArgument
from sandbox.limits import ResolvedLimits

__all__ = [
    "MAX_NAME_BYTES",
    "OMIT_REASONS",
    "OUTPUTS_DIR",
    "FileDigest",
    "FilesLike",
    "InputFile",
    "OmittedOutput",
    "OutputFile",
    "check_inputs",
    "check_name",
    "input_files",
    "name_problem",
]

MAX_NAME_BYTES = 1024
MAX_COMPONENT_BYTES = 255
OUTPUTS_DIR = "outputs"

# Why an output was not returned.
OMIT_REASONS = {
    "output_files": "more files than the output_files limit",
    "output_file_bytes": "larger than the output_file_bytes limit",
    "output_bytes": "would take the returned files past the output_bytes limit",
    "symlink": "a symbolic link; links are never followed",
    "not_regular": "not a regular file (a fifo, socket or device)",
    "bad_name": "its name is not a valid file name",
    "unreadable": "it could not be read",
    "more": "further omitted files, counted here and not listed",
}


def name_problem(name: object) -> str | None:
    """Why ``name`` is not a valid file name, or None when it is."""
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if size > MAX_NAME_BYTES:
        return f"is longer than {MAX_NAME_BYTES} bytes"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "contains a NUL or control character"
    if "\\" in name:
        return "contains a backslash"
    if name.startswith("/"):
        return "is an absolute path"
    for part in name.split("/"):
        if part in ("", ".", ".."):
            return f"has a {part or 'empty'!r} component (no '..', '.' or '//')"
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            return f"has a component longer than {MAX_COMPONENT_BYTES} bytes"
    return None


def check_name(name: object, where: str) -> str:
    """``name`` when valid, else `InvalidArgument` naming it and ``where``."""
    problem = name_problem(name)
    if problem is not None:
        raise InvalidArgument(f"{where} {name!r}: the file name {problem}")
    assert isinstance(name, str)
    return name


@dataclass(frozen=True)
class FileDigest:
    """A file as results and audit records name it: never its bytes."""

    name: str
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class InputFile:
    """One file the script finds in its working directory."""

    name: str
    data: bytes = field(repr=False)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def digest(self) -> FileDigest:
        """What a result and its audit record keep of it: name, size and hash."""
        return FileDigest(self.name, len(self.data), self.sha256)


@dataclass(frozen=True)
class OutputFile:
    """One file the script wrote under ``outputs/``: ``data`` is empty where only the digest
    was kept (an audit record)."""

    name: str  # relative to outputs/
    size: int
    sha256: str
    data: bytes = field(default=b"", repr=False)

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Writes the file under ``directory`` (subdirectories made as needed); returns its
        path. The name was checked by the host, so it cannot leave ``directory``."""
        check_name(self.name, "output file")
        if len(self.data) != self.size:
            raise ValueError(f"output file {self.name!r}: only its digest was kept")
        root = Path(directory)
        path = root.joinpath(*self.name.split("/"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.data)
        return path

    def to_json(self, content: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "size": self.size, "sha256": self.sha256}
        if content:
            out["content_base64"] = base64.b64encode(self.data).decode("ascii")
        return out


@dataclass(frozen=True)
class OmittedOutput:
    """A file under ``outputs/`` that was not returned: why (a key of `OMIT_REASONS`), its size
    where known, and the limit it would have broken. For ``more``, ``size`` counts files."""

    name: str
    reason: str
    size: int | None = None
    limit: int | None = None
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "reason": self.reason,
            "size": self.size,
            "limit": self.limit,
            "detail": self.detail,
        }


FileSource = bytes | str | os.PathLike[str]
FilesLike = (
    Mapping[str, FileSource] | Iterable[InputFile | str | os.PathLike[str] | tuple[str, FileSource]]
)


def input_files(files: FilesLike | None) -> tuple[InputFile, ...]:
    """Input files from what a caller has at hand: ``{name: bytes or Path}``, paths (named by
    their base name), ``(name, bytes or Path)`` pairs or `InputFile`s. A path is read now."""
    if files is None:
        return ()
    items: Iterable[Any] = files.items() if isinstance(files, Mapping) else files
    out: list[InputFile] = []
    for item in items:
        if isinstance(item, InputFile):
            out.append(item)
            continue
        if isinstance(item, tuple):
            name, source = item
        else:
            name, source = os.path.basename(os.fspath(item)), item
        data = bytes(source) if isinstance(source, (bytes, bytearray, memoryview)) else None
        if data is None:
            data = Path(os.fspath(source)).read_bytes()
        out.append(InputFile(str(name), data))
    return tuple(out)


def check_inputs(files: Iterable[InputFile], limits: ResolvedLimits) -> tuple[InputFile, ...]:
    """Checks the request's input files once against their names and limits; raises
    `InvalidArgument` naming the file and the limit."""
    checked = tuple(files)
    if len(checked) > limits.input_files:
        raise InvalidArgument(
            f"input_files: {len(checked)} files is more than the input_files limit of "
            f"{limits.input_files}"
        )
    total = 0
    seen: set[str] = set()
    dirs: set[str] = set()
    for item in checked:
        name = check_name(item.name, "input_files:")
        if name == OUTPUTS_DIR or name.startswith(OUTPUTS_DIR + "/"):
            raise InvalidArgument(
                f"input_files: {name!r}: inputs may not be placed under {OUTPUTS_DIR}/"
            )
        if name in seen:
            raise InvalidArgument(f"input_files: {name!r}: the name is given twice")
        if name in dirs:
            raise InvalidArgument(f"input_files: {name!r}: another input lies under it")
        parts = name.split("/")
        for depth in range(1, len(parts)):
            prefix = "/".join(parts[:depth])
            if prefix in seen:
                raise InvalidArgument(
                    f"input_files: {name!r}: {prefix!r} is a file, not a directory"
                )
            dirs.add(prefix)
        seen.add(name)
        total += len(item.data)
        if total > limits.input_bytes:
            raise InvalidArgument(
                f"input_files: {name!r}: the input files take more than the input_bytes limit of "
                f"{limits.input_bytes} bytes"
            )
    if total > limits.file_size_bytes:
        raise InvalidArgument(
            f"input_files: {total} bytes do not fit the sandbox's working directory "
            f"(file_size limit of {limits.file_size_bytes} bytes)"
        )
    return checked
