"""The zygote's fork loop in C (`sandbox/guest/forkloop.c`): built with the package, used by
default, and left for the Python loop when it is not wanted or cannot load, with a note.

Which loop forks is read from the zygote itself: the library is in its memory map or not.
What either loop forks is the same sandbox (the conformance and security suites run on the
default, the C loop; `test_zygote_protocol` and the zygote lifecycle tests run on both).
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox.guest import FORK_LOOP_FILE, fork_loop_library

if TYPE_CHECKING:
    from tests.conftest import EngineHarness

pytestmark = pytest.mark.requires_bwrap

GUEST_LIBRARY = f"/ptc/{FORK_LOOP_FILE}"  # the runtime directory, as the zygote sees it


def _maps_library(harness: EngineHarness) -> bool:
    maps = Path(f"/proc/{harness.zygote_pid()}/maps").read_text()
    return GUEST_LIBRARY in maps


def _runs_scripts(harness: EngineHarness) -> None:
    for n in range(5):
        result = harness.run(f"import os; print({n}, os.getpid())")
        assert (result.status, result.exit_code) == ("ok", 0), result.to_json()
        # Born pid 1 of its own pid namespace (clone3), its bootstrap the one process there.
        assert result.stdout == f"{n} 1\n"


@pytest.fixture
def own_harness(engine_harness: type[EngineHarness]) -> Iterator[list[EngineHarness]]:
    made: list[EngineHarness] = []
    yield made
    for harness in made:
        assert harness.leftovers() == []
        harness.close()


def test_the_package_is_built_with_its_fork_loop() -> None:
    library = fork_loop_library()
    assert library is not None, (
        "sandbox/guest/forkloop.c is not built: install the package with a C compiler "
        "(scripts/setup.sh installs gcc where it is missing)"
    )
    from sandbox.guest import _forkloop  # the zygote's side, importable from the host too

    assert _forkloop.LIBRARY == FORK_LOOP_FILE


def test_the_zygote_forks_from_its_c_loop_by_default(
    engine_harness: type[EngineHarness], own_harness: list[EngineHarness]
) -> None:
    harness = engine_harness(pool_size=1)
    own_harness.append(harness)
    assert (harness.runtime_dir / FORK_LOOP_FILE).is_file()
    _runs_scripts(harness)
    assert _maps_library(harness)


def test_native_fork_loop_false_forks_from_python(
    engine_harness: type[EngineHarness], own_harness: list[EngineHarness]
) -> None:
    harness = engine_harness(pool_size=1, native_fork_loop=False)
    own_harness.append(harness)
    assert not (harness.runtime_dir / FORK_LOOP_FILE).exists()
    _runs_scripts(harness)
    assert not _maps_library(harness)


def _other_abi(tmp_path: Path) -> Path:
    source = tmp_path / "other.c"
    source.write_text("int ptc_fork_loop_abi(void) { return 99; }\n")
    library = tmp_path / "libforkloop.other.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


def _not_elf(tmp_path: Path) -> Path:
    library = tmp_path / "libforkloop.broken.so"
    library.write_bytes(b"not an ELF file\n" * 256)
    return library


@pytest.mark.parametrize(
    ("make", "why", "loaded"),
    [
        (
            _not_elf,
            "the native fork loop cannot be loaded: /ptc/libforkloop.so: invalid ELF header",
            False,
        ),
        # Loaded, asked its ABI, and not called: it has no loop to call.
        (_other_abi, "the native fork loop is ABI 99, this zygote speaks 1", True),
    ],
    ids=["not-elf", "other-abi"],
)
def test_a_library_that_cannot_serve_leaves_the_python_loop_with_a_note(
    engine_harness: type[EngineHarness],
    own_harness: list[EngineHarness],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    make: Callable[[Path], Path],
    why: str,
    loaded: bool,
) -> None:
    library = make(tmp_path)
    monkeypatch.setattr("sandbox.backends.process.runtime_dir.fork_loop_library", lambda: library)
    with caplog.at_level(logging.INFO, logger="sandbox.backends.process.zygote"):
        harness = engine_harness(pool_size=1)
        own_harness.append(harness)
        _runs_scripts(harness)
    notes = [r for r in caplog.records if "ptc-zygote: note: forking" in r.getMessage()]
    assert len(notes) == 1, [r.getMessage() for r in caplog.records]
    assert notes[0].levelno == logging.INFO
    assert (
        notes[0]
        .getMessage()
        .endswith(f"note: forking from Python (about 0.2 ms more CPU per sandbox): {why}")
    ), notes[0].getMessage()
    assert _maps_library(harness) == loaded
