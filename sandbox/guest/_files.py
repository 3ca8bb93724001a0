"""Guest side of files in and out (standard library only; trusted code, run by the bootstrap).

`place_inputs` writes the job's input files into the working directory before the script runs
(mode 0444, directories 0755) and makes ``outputs/``. `snapshot` records what ``outputs/`` holds
before the script, so that `send_outputs` returns only what the script wrote or changed. Both
walk ``outputs/`` through directory descriptors opened with O_NOFOLLOW: a symbolic link is never
followed, it is reported as omitted, as are fifos, sockets and devices and names that are not
valid. Files are read up to the limits the job carries and go to the host in chunks that fit
the channel's frame cap; everything sent is checked again by the host, which trusts none of it.
"""

from __future__ import annotations

import base64
import contextlib
import os
import stat
from typing import Any

OUTPUTS = "outputs"
MAX_NAME_BYTES = 1024
MAX_COMPONENT_BYTES = 255
MAX_OMITTED_SENT = 10000  # omit frames; the host lists 100 and counts them all
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

Signature = tuple[int, int, int, int]


def place_inputs(workdir: str, files: list[dict[str, Any]]) -> None:
    """Writes each input file (name, base64 data) under ``workdir``, read-only."""
    for item in files:
        name = str(item["name"])
        path = os.path.join(workdir, *name.split("/"))
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # an earlier copy (a session's), or a link planted there: replaced
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o444)
        try:
            view = memoryview(base64.b64decode(item["data"]))
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, 0o444)
        finally:
            os.close(fd)
    with contextlib.suppress(FileExistsError):
        os.mkdir(os.path.join(workdir, OUTPUTS), 0o755)


def _valid(name: str) -> bool:
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes in the file name (surrogate escapes)
        return False
    return (
        0 < len(raw) <= MAX_NAME_BYTES
        and not any(ord(c) < 32 or ord(c) == 127 for c in name)
        and "\\" not in name
        and all(0 < len(p.encode()) <= MAX_COMPONENT_BYTES for p in name.split("/"))
    )


def _shown(name: str) -> str:
    """A printable form of a name that is not valid."""
    text = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return "".join(c if 32 <= ord(c) != 127 else "?" for c in text)[:MAX_NAME_BYTES]


def _walk(workdir: str) -> list[tuple[str, int, os.stat_result | None, str]]:
    """Every entry under outputs/ as (name, dir fd, lstat, kind); kind is ``file``, ``symlink``,
    ``not_regular`` or ``bad_name``. Directory fds stay open until `_close` is called."""
    entries: list[tuple[str, int, os.stat_result | None, str]] = []
    try:
        root = os.open(os.path.join(workdir, OUTPUTS), _DIR_FLAGS)
    except OSError:
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.lstat(os.path.join(workdir, OUTPUTS)).st_mode):
                entries.append(("", -1, None, "symlink"))
        return entries
    stack = [("", root)]
    while stack:
        prefix, dir_fd = stack.pop()
        entries.append((prefix, dir_fd, None, "dir"))
        try:
            names = sorted(entry.name for entry in os.scandir(dir_fd))
        except OSError:
            continue
        for base in names:
            name = f"{prefix}{base}"
            try:
                info = os.stat(base, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                try:
                    child = os.open(base, _DIR_FLAGS, dir_fd=dir_fd)
                except OSError:
                    entries.append((name, dir_fd, info, "not_regular"))
                    continue
                stack.append((name + "/", child))
            elif not _valid(name):
                entries.append((name, dir_fd, info, "bad_name"))
            elif stat.S_ISLNK(info.st_mode):
                entries.append((name, dir_fd, info, "symlink"))
            elif stat.S_ISREG(info.st_mode):
                entries.append((name, dir_fd, info, "file"))
            else:
                entries.append((name, dir_fd, info, "not_regular"))
    return entries


def _close(entries: list[tuple[str, int, os.stat_result | None, str]]) -> None:
    for _name, dir_fd, _info, kind in entries:
        if kind == "dir":
            with contextlib.suppress(OSError):
                os.close(dir_fd)


def _signature(info: os.stat_result) -> Signature:
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def snapshot(workdir: str) -> dict[str, Signature]:
    """What outputs/ holds now: a file the script leaves as it was is not returned."""
    entries = _walk(workdir)
    try:
        return {n: _signature(i) for n, _fd, i, _k in entries if i is not None and _k != "dir"}
    finally:
        _close(entries)


def _read(base: str, dir_fd: int, cap: int) -> bytes | str:
    """The file's bytes (at most cap + 1), or why it was not read."""
    try:
        fd = os.open(base, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        return "symlink" if exc.errno == 40 else "unreadable"  # ELOOP: swapped for a link
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "not_regular"
        chunks: list[bytes] = []
        left = cap + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return "unreadable"
    finally:
        os.close(fd)


def send_outputs(
    channel: Any, workdir: str, before: dict[str, Signature], caps: dict[str, int]
) -> None:
    """Sends what the script wrote or changed under outputs/ as ``out`` frames (chunked) and
    what was not returned as ``omit`` frames, within ``caps`` (the job's output limits)."""
    sending = _Sending(channel, caps)
    entries = _walk(workdir)
    try:
        for name, dir_fd, info, kind in entries:
            if kind == "dir" or (info is None and kind != "symlink"):
                continue
            if info is not None and before.get(name) == _signature(info):
                continue  # there before the script, untouched
            if kind != "file":
                shown = OUTPUTS if info is None else name
                sending.omit(_shown(shown), kind, None if info is None else info.st_size)
                continue
            assert info is not None
            sending.file(name, dir_fd, info.st_size)
        sending.finish()
    finally:
        _close(entries)


class _Sending:
    """One `send_outputs`: what it has sent and omitted so far, against the job's caps."""

    def __init__(self, channel: Any, caps: dict[str, int]) -> None:
        self.channel = channel
        self.max_files, self.max_file = caps["files"], caps["file_bytes"]
        self.max_total = caps["bytes"]
        self.chunk = max(1024, caps["frame_bytes"] - 4096) // 4 * 3  # base64 fits a frame
        self.sent = self.total = self.omitted = self.unlisted = 0

    def omit(self, name: str, reason: str, size: int | None, limit: int | None = None) -> None:
        """An ``omit`` frame, or past `MAX_OMITTED_SENT` a count for the closing ``more``."""
        if self.omitted >= MAX_OMITTED_SENT:
            self.unlisted += 1
            return
        self.omitted += 1
        frame = {"t": "omit", "name": name, "reason": reason, "size": size, "limit": limit}
        self.channel.send(frame)

    def file(self, name: str, dir_fd: int, size: int) -> None:
        """Sends one regular file in chunks, or omits it naming the cap it would pass."""
        if self.sent >= self.max_files:
            self.omit(name, "output_files", size, self.max_files)
            return
        data = _read(name.rpartition("/")[2], dir_fd, self.max_file)
        if isinstance(data, str):
            self.omit(name, data, size)
        elif len(data) > self.max_file:
            self.omit(name, "output_file_bytes", max(len(data), size), self.max_file)
        elif self.total + len(data) > self.max_total:
            self.omit(name, "output_bytes", len(data), self.max_total)
        else:
            self.sent += 1
            self.total += len(data)
            self._chunks(name, data)

    def _chunks(self, name: str, data: bytes) -> None:
        offset = 0
        while True:
            piece = data[offset : offset + self.chunk]
            encoded = base64.b64encode(piece).decode("ascii")
            self.channel.send(
                {"t": "out", "name": name, "size": len(data), "offset": offset, "data": encoded}
            )
            offset += len(piece)
            if offset >= len(data):
                break

    def finish(self) -> None:
        """The closing ``more`` frame, counting the omissions not listed one by one."""
        if self.unlisted:
            more = {"t": "omit", "name": "", "reason": "more", "size": self.unlisted, "limit": None}
            self.channel.send(more)
