"""The guest's file handling (`sandbox/guest/_files.py`) on a real directory, outside a sandbox.

The module is standard-library only and runs the same here as in the guest: it places inputs,
snapshots outputs/, and sends only what changed since the snapshot (what a session's later
execution relies on), never following a link. Its frames go through the host's own parser and
collector, as they do over the channel.
"""

from __future__ import annotations

import base64
import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from sandbox.execution.outputs import OutputCollector
from sandbox.guest import GUEST_DIR
from sandbox.limits import DEFAULTS
from sandbox.protocol import GuestOmit, GuestOutput, parse_guest_message

_spec = importlib.util.spec_from_file_location("_ptc_guest_files", GUEST_DIR / "_files.py")
assert _spec is not None and _spec.loader is not None
guest_files: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(guest_files)

CAPS = {"files": 64, "file_bytes": 1 << 20, "bytes": 4 << 20, "frame_bytes": 8192}


class Frames:
    """Collects what the guest sends, parsed as the host parses it."""

    def __init__(self) -> None:
        self.collector = OutputCollector(DEFAULTS)

    def send(self, message: dict[str, Any]) -> None:
        parsed = parse_guest_message(message)
        assert isinstance(parsed, (GuestOutput, GuestOmit))
        self.collector.receive(parsed)


def _collect(workdir: Path, before: dict[str, Any], caps: dict[str, int] = CAPS) -> Any:
    frames = Frames()
    guest_files.send_outputs(frames, str(workdir), before, caps)
    frames.collector.finish()
    return frames.collector


def test_inputs_are_placed_read_only_and_outputs_made(tmp_path: Path) -> None:
    data = os.urandom(5000)
    files = [
        {"name": "a.bin", "data": base64.b64encode(data).decode()},
        {"name": "d/e/f.txt", "data": base64.b64encode(b"x").decode()},
    ]
    guest_files.place_inputs(str(tmp_path), files)
    assert (tmp_path / "a.bin").read_bytes() == data
    assert (tmp_path / "d" / "e" / "f.txt").stat().st_mode & 0o777 == 0o444
    assert (tmp_path / "outputs").is_dir() and list((tmp_path / "outputs").iterdir()) == []


def test_only_what_changed_since_the_snapshot_is_sent(tmp_path: Path) -> None:
    guest_files.place_inputs(str(tmp_path), [])
    out = tmp_path / "outputs"
    (out / "kept").write_bytes(b"old")
    (out / "changed").write_bytes(b"old")
    before = guest_files.snapshot(str(tmp_path))
    os.utime(out / "changed", ns=(1, 1))  # a change the signature sees even at equal size
    (out / "changed").write_bytes(b"new")
    (out / "new").write_bytes(b"n" * 20000)  # several chunks at an 8 KiB frame cap
    collector = _collect(tmp_path, before)
    assert [(f.name, f.data) for f in collector.files] == [
        ("changed", b"new"),
        ("new", b"n" * 20000),
    ]
    assert collector.omitted == []


def test_links_fifos_and_bad_names_are_omitted_not_followed(tmp_path: Path) -> None:
    guest_files.place_inputs(str(tmp_path), [])
    out = tmp_path / "outputs"
    secret = tmp_path / "secret"
    secret.write_text("secret")
    (out / "link").symlink_to(secret)
    (out / "dirlink").symlink_to(tmp_path)
    os.mkfifo(out / "fifo")
    (out / "bad\x7fname").write_text("x")
    collector = _collect(tmp_path, {})
    assert collector.files == []
    assert sorted((o.name, o.reason) for o in collector.omitted) == [
        ("bad?name", "bad_name"),
        ("dirlink", "symlink"),
        ("fifo", "not_regular"),
        ("link", "symlink"),
    ]


@pytest.mark.parametrize("count", [150])
def test_omissions_past_the_listed_cap_are_counted(tmp_path: Path, count: int) -> None:
    guest_files.place_inputs(str(tmp_path), [])
    for i in range(count):
        os.symlink("/etc/passwd", tmp_path / "outputs" / f"l{i:03d}")
    collector = _collect(tmp_path, {})
    assert len(collector.omitted) == 101
    assert collector.omitted[-1].reason == "more" and collector.omitted[-1].size == count - 100


def test_placing_an_input_replaces_a_link_planted_at_its_name(tmp_path: Path) -> None:
    """In a session a script could leave a link where the next input goes: the input
    replaces the link, never writes through it."""
    target = tmp_path / "target"
    target.write_bytes(b"untouched")
    (tmp_path / "in.txt").symlink_to(target)
    guest_files.place_inputs(str(tmp_path), [{"name": "in.txt", "data": "bmV3"}])
    assert (tmp_path / "in.txt").read_bytes() == b"new" and not (tmp_path / "in.txt").is_symlink()
    assert target.read_bytes() == b"untouched"
