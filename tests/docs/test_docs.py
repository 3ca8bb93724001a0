"""Every code block of the README and of `docs/` runs, so that no example drifts from the code.

Sybil's Markdown lexer finds the fenced blocks; the info string after the language says what a
block is. Each document runs in a temporary working directory of its own, its blocks in order,
its `python` blocks sharing one namespace:

| info string | what the test does |
| --- | --- |
| `python` | runs it as host Python in the document's namespace |
| `python file="NAME"` | writes NAME (a sandbox script: `tools` and top-level `await`); compiles it |
| `json`, `toml` (`file="NAME"` optional) | parses it; writes NAME when given |
| `sh` | `bash -euo pipefail` in the working directory with the project's `.venv/bin` first on |
|  | `PATH` and `PTC_CHECKOUT` naming the checkout; must exit 0. `cwd="checkout"` runs it in |
|  | the checkout instead |
| `ts` | left to the TypeScript suite, which runs each against a server of its own |
|  | (`clients/typescript/test/docs.test.ts`) |
| any of them with `skip="REASON"` | skips it, reported with the reason |
| `text`, `proto`, `yaml`, `console` | prose in a box: not run |

A block in any other language fails the test, so that nothing is left unrun by accident. The
server's documented default address `127.0.0.1:50051` is replaced in every block by a free
loopback port of the test's, and processes a `sh` block leaves in the background (`ptc serve
... &`) are stopped when its document ends. A document whose examples leave a process of this test
behind (an engine never closed) fails.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from sybil import Document, Example, Region
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer

CHECKOUT = Path(__file__).resolve().parents[2]
DOCUMENTS = [CHECKOUT / "README.md", *sorted((CHECKOUT / "docs").glob("*.md"))]
DEFAULT_ADDRESS = "127.0.0.1:50051"
PROSE = {"text", "proto", "yaml", "console"}
# Run by clients/typescript/test/docs.test.ts (Node, against a `ptc serve` of its own).
NODE_RUN = {"ts"}
BLOCK_TIMEOUT_S = 300

_INFO = re.compile(r"(?P<language>[\w-]*)(?P<settings>[^\n]*)$\n", re.MULTILINE)
_SETTING = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, its `key="value"` settings and its text."""

    language: str
    settings: dict[str, str]
    source: str


@dataclass
class Run:
    """What the blocks of one document share: the working directory, the address, and the
    process groups their `sh` blocks started."""

    workdir: Path
    address: str
    groups: list[int] = field(default_factory=list)

    def text(self, source: str) -> str:
        return source.replace(DEFAULT_ADDRESS, self.address)


def _parse(document: Document) -> Iterable[Region]:
    lexer = RawFencedCodeBlockLexer(info_pattern=_INFO)
    for region in lexer(document):
        settings = dict(_SETTING.findall(region.lexemes["settings"]))
        region.parsed = Block(region.lexemes["language"], settings, str(region.lexemes["source"]))
        yield region


def _free_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def _where(example: Example) -> str:
    return f"{Path(example.path).relative_to(CHECKOUT)}:{example.line}"


def _run_python(example: Example, block: Block, run: Run) -> None:
    code = compile(run.text(block.source), _where(example), "exec")
    exec(code, example.namespace)  # the documentation's own example


def _write(block: Block, run: Run, check: Any) -> None:
    text = run.text(block.source)
    check(text)
    if "file" in block.settings:
        (run.workdir / block.settings["file"]).write_text(text)


def _sandbox_script(text: str) -> None:
    compile(text, "<script>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)


def _run_sh(example: Example, block: Block, run: Run) -> None:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PTC_CHECKOUT"] = str(CHECKOUT)  # what the TypeScript install packs the package from
    cwd = CHECKOUT if block.settings.get("cwd") == "checkout" else run.workdir
    # Output goes to a file, not a pipe: a server the block leaves in the background keeps
    # its inherited descriptors open, and the block would never seem to end.
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", run.text(block.source)],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        run.groups.append(process.pid)
        try:
            process.wait(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.seek(0)
        output = log.read().decode(errors="replace")[-4000:]
    if process.returncode != 0:
        pytest.fail(f"{_where(example)}: exit {process.returncode}:\n{output}")


def _stop(groups: list[int]) -> None:
    """Stops what the document's `sh` blocks left in the background (SIGTERM, then SIGKILL)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for group in groups:
            try:
                os.killpg(group, sig)
                alive.append(group)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while alive and time.monotonic() < deadline:
            alive = [g for g in alive if _group_alive(g)]
            time.sleep(0.05)
        if not alive:
            return


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def _evaluate(example: Example, run: Run) -> None:
    block: Block = example.parsed
    if "skip" in block.settings:
        return
    if block.language == "python" and "file" in block.settings:
        _write(block, run, _sandbox_script)
    elif block.language == "python":
        _run_python(example, block, run)
    elif block.language == "json":
        _write(block, run, json.loads)
    elif block.language == "toml":
        _write(block, run, tomllib.loads)
    elif block.language == "sh":
        _run_sh(example, block, run)
    elif block.language not in PROSE | NODE_RUN:
        pytest.fail(
            f"{_where(example)}: a block in {block.language or 'no language'!r}: "
            f"give it a language this test runs, or one of {sorted(PROSE | NODE_RUN)}"
        )


def _examples(path: Path) -> Iterator[Example]:
    yield from Document.parse(str(path), _parse).examples()


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(CHECKOUT)))
def test_every_block_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run = Run(workdir=tmp_path, address=_free_address())
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    try:
        for example in _examples(path):
            _evaluate(example, run)
    finally:
        _stop(run.groups)
    # An example that leaves a process behind (an engine it never closed) teaches users to
    # leak it too, and would poison every later test's leftover check.
    left = [
        f"{child.pid}: {' '.join(child.cmdline())[:120]}"
        for child in psutil.Process().children(recursive=True)
        if child.pid not in before and child.is_running() and child.status() != "zombie"
    ]
    assert not left, f"{path.name}'s examples left processes behind: {left}"


def _skipped() -> list[Any]:
    return [
        pytest.param(example.parsed.settings["skip"], id=_where(example))
        for path in DOCUMENTS
        for example in _examples(path)
        if "skip" in example.parsed.settings
    ]


@pytest.mark.parametrize("reason", _skipped())
def test_blocks_not_run(reason: str) -> None:
    """Each block the documents mark `skip` is reported as a skipped test with its reason."""
    assert reason.strip(), "a skipped block must say why"
    pytest.skip(f"not run: {reason}")


def test_the_harness_finds_every_block() -> None:
    """The lexer sees as many blocks as there are opening fences (a mis-lexed block would
    otherwise never run, and never fail)."""
    for path in DOCUMENTS:
        text = path.read_text()
        fences = re.findall(r"^\s*```", text, flags=re.MULTILINE)
        blocks = list(_examples(path))
        assert len(blocks) * 2 == len(fences), f"{path}: {len(fences)} fences, {len(blocks)} blocks"
        for example in blocks:
            block: Block = example.parsed
            unknown = set(block.settings) - {"file", "skip", "cwd"}
            assert not unknown, f"{_where(example)}: unknown settings {sorted(unknown)}"
            assert shlex.split(block.settings.get("file", "x")), _where(example)
