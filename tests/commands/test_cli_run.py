"""`ptc run` as outside tools use it: DESIGN.md's `--json` contract, exit codes, `-` for stdin,
`--limit`, `--tools`, `--policy`, the readable summary, and nothing left behind.

Every test runs the real command line in a subprocess with a private TMPDIR, so that the
runtime directory it creates can be checked gone afterwards.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ptc_cli import run_ptc

RunPtc = Callable[..., Any]

MANIFEST = [
    {
        "type": "function",
        "function": {
            "name": "lookup-user",
            "description": "Finds a user.",
            "parameters": {
                "type": "object",
                "properties": {"id": {"type": "integer"}},
                "required": ["id"],
            },
        },
    }
]


ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable


def _cgroup_dirs() -> set[Path]:
    """Where a CLI started by this test puts its cgroup parents: in every cgroup hierarchy, at
    the root and at this process's own cgroup (which the CLI inherits)."""
    own = {line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()}
    dirs: set[Path] = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, fs = line.partition(" - ")
        if fs.split()[0] not in ("cgroup", "cgroup2"):
            continue
        root, mountpoint = fields.split()[3:5]
        dirs.add(Path(mountpoint))
        for rel in own:
            if rel.startswith(root):
                dirs.add(Path(mountpoint) / rel[len(root) :].lstrip("/"))
    return dirs


def cli_leftovers(pid: int) -> list[str]:
    """What the `ptc` process ``pid`` has running or created: cgroups named after it
    (``ptc-<pid>-<n>``), processes in them, and processes that mount its runtime dir
    (``ptc-runtime-<pid>-*``). Other processes on this machine are not looked at."""
    found = [f"cgroup {d}" for base in _cgroup_dirs() for d in base.glob(f"ptc-{pid}-*")]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cgroup = (proc / "cgroup").read_text()
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if f"/ptc-{pid}-" in cgroup or f"/ptc-runtime-{pid}-" in cmdline:
            found.append(f"process {proc.name}: {cmdline.replace(chr(0), ' ')[:100]}")
    return sorted(found)


@pytest.fixture
def cli_pids() -> list[int]:
    """The pids of the `ptc` processes this test ran, for the leftover check."""
    return []


@pytest.fixture
def ptc(cli_pids: list[int]) -> RunPtc:
    """The real command line in a subprocess (`run_ptc`), its pid recorded."""
    return functools.partial(run_ptc, pids=cli_pids)


@pytest.fixture
def tmpdir_env(cli_pids: list[int]) -> Iterator[dict[str, str]]:
    # World-traversable: the sandbox's uid must reach the runtime dir created in it.
    private = Path(tempfile.mkdtemp(prefix="clitmp-", dir="/tmp"))
    private.chmod(0o755)
    yield {"TMPDIR": str(private)}
    left = list(private.iterdir())
    shutil.rmtree(private)
    assert left == [], "ptc run left files in its TMPDIR"
    assert cli_pids, "the test ran no ptc process"
    assert [(pid, cli_leftovers(pid)) for pid in cli_pids] == [(pid, []) for pid in cli_pids]


@pytest.fixture
def manifest_file(tmp_path: Path) -> Path:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(MANIFEST))
    return path


def run_json(
    ptc: RunPtc, env: dict[str, str], *args: str, stdin: str = ""
) -> tuple[int, dict[str, Any]]:
    proc = ptc("run", *args, "--json", stdin=stdin, env=env)
    # Exactly one JSON object on stdout, nothing else.
    return proc.returncode, json.loads(proc.stdout)


def test_json_contract(ptc: RunPtc, tmpdir_env: dict[str, str], manifest_file: Path) -> None:
    script = "import tools\nprint(tools.lookup_user(id=7))\ntry:\n    tools.lookup_user(id='x')\nexcept tools.InvalidArguments:\n    pass\n"
    code, out = run_json(ptc, tmpdir_env, "-", "--tools", str(manifest_file), stdin=script)
    assert code == 0
    for key in ("status", "exit_code", "stdout", "stderr", "calls", "violations", "usage"):
        assert key in out
    assert (out["status"], out["exit_code"], out["stdout"], out["stderr"]) == (
        "ok", 0, "{'id': 7}\n", "",
    )  # fmt: skip
    ok, bad = out["calls"]
    assert (ok["seq"], ok["tool"], ok["arguments"], ok["status"], ok["result"]) == (
        1, "lookup-user", {"id": 7}, "ok", {"id": 7},
    )  # fmt: skip
    assert (bad["seq"], bad["status"], "result" in bad) == (2, "invalid_arguments", False)
    assert "'id'" in bad["error"]
    for call in out["calls"]:
        assert isinstance(call["start_offset_s"], float) and isinstance(call["duration_s"], float)
        assert call["idempotency_key"] == f"{out['execution_id']}:{call['seq']}"
    assert out["violations"] == []
    assert out["usage"]["tool_calls"] == 2
    assert out["usage"]["stdout_bytes"] == len("{'id': 7}\n")
    for key in ("wall_time_s", "cpu_time_s", "peak_memory_bytes", "stderr_bytes"):
        assert key in out["usage"]


def test_json_violation_fields_and_limit_units(ptc: RunPtc, tmpdir_env: dict[str, str]) -> None:
    code, out = run_json(
        ptc,
        tmpdir_env,
        "-",
        "--limit", "wall_time=1",
        "--limit", "stdout_bytes=10",
        "--limit", "memory=268435456",
        stdin="print('x' * 20, flush=True)\nimport time\ntime.sleep(30)",
    )  # fmt: skip
    assert code == 3
    assert out["status"] == "limit_exceeded"
    assert [(v["limit"], v["limit_value"], v["action"]) for v in out["violations"]] == [
        ("wall_time", 1.0, "killed"),
        ("stdout_bytes", 10, "truncated"),
    ]
    for violation in out["violations"]:
        assert {"limit", "limit_value", "observed", "action"} <= set(violation)
    assert out["violations"][1]["observed"] == 21
    assert out["limits"]["memory_bytes"] == 268435456
    assert out["limits"]["wall_time_ms"] == 1000  # the proto's unit-named fields
    assert out["stdout"].startswith("xxxxxxxxxx\n[ptc: stdout truncated: 11 bytes dropped")


@pytest.mark.parametrize(
    ("script", "extra", "code", "status"),
    [
        ("print(1)", [], 0, "ok"),
        ("raise SystemExit(5)", [], 1, "error"),
        ("while True: pass", ["--limit", "cpu_time=1"], 3, "limit_exceeded"),
        ("print(1", [], 4, "rejected"),
        ("import os", ["--policy", "restricted"], 4, "rejected"),
    ],
    ids=["ok", "error", "limit", "syntax", "policy"],
)
def test_exit_code_reflects_status(
    ptc: RunPtc, tmpdir_env: dict[str, str], script: str, extra: list[str], code: int, status: str
) -> None:
    got, out = run_json(ptc, tmpdir_env, "-", *extra, stdin=script)
    assert (got, out["status"]) == (code, status)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/nonexistent/script.py"], "ptc run: script /nonexistent/script.py:"),
        (["-", "--limit", "wall_time=abc"], "ptc run: limit wall_time: 'abc' is not a number"),
        (["-", "--limit", "bogus=1"], "ptc run: --limit 'bogus=1': expected NAME=VALUE"),
        (["-", "--tools", "/nonexistent/tools.json"], "ptc run: --tools /nonexistent/tools.json:"),
    ],
    ids=["missing-script", "bad-limit-value", "unknown-limit", "missing-manifest"],
)
def test_bad_requests_exit_2_with_a_message(
    ptc: RunPtc, tmpdir_env: dict[str, str], args: list[str], message: str
) -> None:
    proc = ptc("run", *args, "--json", stdin="print(1)", env=tmpdir_env)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith(message)


def test_bad_manifest_exits_2(ptc: RunPtc, tmpdir_env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('[{"name": "x", "x-ptc": {"mode": "teleport"}}]')
    proc = ptc("run", "-", "--tools", str(bad), "--json", stdin="print(1)", env=tmpdir_env)
    assert proc.returncode == 2
    assert proc.stderr.startswith("ptc run: manifest")


def test_script_from_stdin_never_sees_its_own_source(
    ptc: RunPtc, tmpdir_env: dict[str, str]
) -> None:
    code, out = run_json(
        ptc, tmpdir_env, "-", stdin="import sys\nprint(repr(sys.stdin.read()))\n# marker"
    )
    assert (code, out["stdout"]) == (0, "''\n")


def test_script_from_a_file(ptc: RunPtc, tmpdir_env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("print('from file')")
    proc = ptc("run", str(script), "--json", stdin="print('from stdin')", env=tmpdir_env)
    assert (proc.returncode, json.loads(proc.stdout)["stdout"]) == (0, "from file\n")


def test_expect_flag(ptc: RunPtc, tmpdir_env: dict[str, str], manifest_file: Path) -> None:
    code, out = run_json(
        ptc, tmpdir_env, "-", "--tools", str(manifest_file), "--expect", "lookup-user=2",
        stdin="import tools\ntools.lookup_user(id=1)",
    )  # fmt: skip
    assert (code, out["status"]) == (3, "limit_exceeded")
    assert [(v["limit"], v["limit_value"], v["observed"]) for v in out["violations"]] == [
        ("expected_calls", 2, 1)
    ]


def test_readable_summary(ptc: RunPtc, tmpdir_env: dict[str, str], manifest_file: Path) -> None:
    proc = ptc(
        "run", "-", "--tools", str(manifest_file), "--limit", "max_tool_calls=1",
        stdin="import tools\nprint('hello')\ntools.lookup_user(id=1)\ntools.lookup_user(id=2)",
        env=tmpdir_env,
    )  # fmt: skip
    assert proc.returncode == 3
    assert proc.stdout == "hello\n"
    assert "── status: limit_exceeded  exit code: 1" in proc.stderr
    assert "── 2 tool calls" in proc.stderr
    assert re.search(r"\s1\s+lookup-user\s+ok\s", proc.stderr)
    assert re.search(r"\s2\s+lookup-user\s+refused\s", proc.stderr)
    assert (
        "── violation: max_tool_calls = 1 count, observed 2, refused (host evidence)."
        in proc.stderr
    )
    assert "── error: CallRefused: the budget of 1 tool calls is spent (line 4)" in proc.stderr


def test_no_process_survives_the_cli(ptc: RunPtc, tmpdir_env: dict[str, str]) -> None:
    code, out = run_json(
        ptc, tmpdir_env, "-", "--limit", "wall_time=1",
        stdin="import os, time\nfor _ in range(5):\n    if os.fork() == 0:\n        time.sleep(60)\ntime.sleep(60)",
    )  # fmt: skip
    assert (code, out["status"]) == (3, "limit_exceeded")
    # Nothing of this run is left: tmpdir_env checks the CLI's cgroups and processes.


def test_cli_leftovers_sees_a_running_cli_and_nothing_after_it(
    tmpdir_env: dict[str, str], cli_pids: list[int], tmp_path: Path
) -> None:
    """The leftover check finds the CLI's own cgroups and sandbox processes while it runs (so an
    empty answer afterwards means something), and none once it has exited."""
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(4)\n")
    with subprocess.Popen(
        [PYTHON, "-m", "sandbox.cli", "run", str(script), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, **tmpdir_env},
    ) as proc:
        cli_pids.append(proc.pid)
        try:
            seen: list[str] = []
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and proc.poll() is None:
                seen = cli_leftovers(proc.pid)
                kinds = {s.split()[0] for s in seen}
                if kinds == {"cgroup", "process"}:
                    break
                time.sleep(0.05)
            out, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
    assert proc.returncode == 0, err
    assert json.loads(out)["status"] == "ok"
    assert any(s.startswith(("cgroup ", "process ")) and f"ptc-{proc.pid}-" in s for s in seen)
    assert {s.split()[0] for s in seen} == {"cgroup", "process"}, seen
    assert cli_leftovers(proc.pid) == []


def test_audit_db_records_the_execution(
    ptc: RunPtc, tmpdir_env: dict[str, str], manifest_file: Path, tmp_path: Path
) -> None:
    db = str(tmp_path / "audit.db")
    done = ptc(
        "run",
        "-",
        "--tools",
        str(manifest_file),
        "--json",
        "--audit-db",
        db,
        stdin="import tools\ntools.lookup_user(id=7)\nprint('done')",
        env=tmpdir_env,
    )
    assert done.returncode == 0, done.stderr
    execution_id = json.loads(done.stdout)["execution_id"]
    listing = ptc("audit", "list", "--db", db, "--json")
    assert listing.returncode == 0, listing.stderr
    records = [json.loads(line) for line in listing.stdout.splitlines()]
    assert [(r["execution_id"], r["status"]) for r in records] == [(execution_id, "ok")]
    shown = ptc("audit", "show", execution_id, "--db", db)
    assert shown.returncode == 0, shown.stderr
    assert "lookup-user" in shown.stdout
    verify = ptc("audit", "verify", "--db", db)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_human_mode_prints_output_as_it_arrives(
    tmpdir_env: dict[str, str], cli_pids: list[int]
) -> None:
    """Defect 7: the first line reaches our pipe while the script still sleeps."""
    root = Path(__file__).resolve().parents[2]
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandbox.cli", "run", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=root,
        env={**os.environ, **tmpdir_env},
    )
    cli_pids.append(proc.pid)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(b"import time\nprint('first', flush=True)\ntime.sleep(3)\nprint('second')\n")
    proc.stdin.close()
    first = proc.stdout.readline()
    first_at = time.monotonic() - started
    still_running = proc.poll() is None
    rest = proc.stdout.read()
    end_at = time.monotonic() - started
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=30) == 0, stderr
    proc.stdout.close()
    proc.stderr.close()
    assert (first, rest) == (b"first\n", b"second\n")
    assert still_running
    assert end_at - first_at >= 2.0, (first_at, end_at)
    assert "── status: ok" in stderr


def test_human_mode_streams_and_still_marks_truncation(
    ptc: RunPtc, tmpdir_env: dict[str, str]
) -> None:
    proc = ptc(
        "run", "-", "--limit", "stdout_bytes=10",
        stdin="print('x' * 20)", env=tmpdir_env,
    )  # fmt: skip
    assert proc.returncode == 3
    assert proc.stdout == (
        "xxxxxxxxxx\n[ptc: stdout truncated: 11 bytes dropped of 21; the cap is 10 bytes]\n"
    )


def test_files_in_and_out_embedded_with_audit(
    ptc: RunPtc, tmpdir_env: dict[str, str], tmp_path: Path
) -> None:
    data = bytes(range(256)) * 16
    source = tmp_path / "in.bin"
    source.write_bytes(data)
    db = str(tmp_path / "audit.db")
    script = "open('outputs/out.bin', 'wb').write(open('renamed.bin', 'rb').read()[::-1])"
    code, result = run_json(
        ptc, tmpdir_env, "-", "--file", f"{source}=renamed.bin", "--audit-db", db, stdin=script
    )
    assert code == 0, result
    [output] = result["output_files"]
    assert output["name"] == "out.bin" and output["size"] == len(data)
    assert base64.b64decode(output["content_base64"]) == data[::-1]
    assert output["sha256"] == hashlib.sha256(data[::-1]).hexdigest()
    assert result["input_files"] == [
        {"name": "renamed.bin", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    ]
    shown = ptc("audit", "show", result["execution_id"], "--db", db)
    assert shown.returncode == 0, shown.stderr
    assert base64.b64encode(data[::-1]).decode() not in shown.stdout  # hashes, not bytes
    assert output["sha256"] in shown.stdout
    verify = ptc("audit", "verify", "--db", db)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_bad_file_arguments_exit_2(ptc: RunPtc, tmpdir_env: dict[str, str], tmp_path: Path) -> None:
    missing = ptc("run", "-", "--file", str(tmp_path / "nope"), stdin="print(1)", env=tmpdir_env)
    assert missing.returncode == 2
    assert missing.stderr == (
        f"ptc run: --file {str(tmp_path / 'nope')!r}: No such file or directory\n"
    )
    (tmp_path / "x").write_bytes(b"")
    escape = ptc("run", "-", "--file", f"{tmp_path / 'x'}=../x", stdin="print(1)", env=tmpdir_env)
    assert escape.returncode == 2
    assert escape.stderr == (
        "ptc run: input_files: '../x': the file name has a '..' component (no '..', '.' or '//')\n"
    )


def _read_until(fd: int, wanted: bytes, proc: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    """What the terminal showed until ``wanted`` appeared (or the process ended, or the
    timeout, a bound for a broken test only, passed)."""
    shown = b""
    deadline = time.monotonic() + timeout_s
    while wanted not in shown and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                shown += os.read(fd, 4096)
            except OSError:  # EIO: the terminal's other end is closed, the CLI is gone
                break
        elif proc.poll() is not None:
            break
    return shown


def test_ptc_run_on_a_terminal_shows_a_line_while_the_script_runs(
    tmpdir_env: dict[str, str], cli_pids: list[int], tmp_path: Path
) -> None:
    """The script prints a line (no flush) and sleeps far past its wall time: the line is on
    the terminal while the CLI still runs, and once the kill ends the run it is shown once."""
    script = tmp_path / "tick.py"
    script.write_text("import time\nprint('tick')\ntime.sleep(600)\n")
    main, terminal = pty.openpty()
    try:
        with subprocess.Popen(
            [PYTHON, "-m", "sandbox.cli", "run", str(script), "--limit", "wall_time=4"],
            stdout=terminal,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env={**os.environ, **tmpdir_env},
        ) as proc:
            cli_pids.append(proc.pid)
            os.close(terminal)
            terminal = -1
            try:
                shown = _read_until(main, b"tick\r\n", proc, timeout_s=60)
                running = proc.poll() is None
                _, err = proc.communicate(timeout=60)
                shown += _read_until(main, b"\0", proc, timeout_s=1)
            finally:
                proc.kill()
    finally:
        os.close(main)
        if terminal >= 0:
            os.close(terminal)
    assert b"tick\r\n" in shown, (shown, err)
    assert running, "the line was shown only after the run ended"
    assert proc.returncode == 3, err  # limit_exceeded
    assert shown.count(b"tick") == 1, shown
    assert b"wall_time" in err, err


@pytest.mark.parametrize("json_out", [False, True], ids=["live", "json"])
def test_ctrl_c_cancels_the_run_and_prints_what_it_wrote(
    json_out: bool, tmp_path: Path, cli_pids: list[int], tmpdir_env: dict[str, str]
) -> None:
    """Ctrl-C on an embedded `ptc run` cancels the execution, which ends `cancelled` with the
    output it wrote so far, printed as any result is (exit 5); before, the command ended at once
    with nothing on stdout (exit 130)."""
    script = tmp_path / "long.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    args = [PYTHON, "-m", "sandbox.cli", "run", str(script), "--limit", "wall_time=600"]
    with subprocess.Popen(
        [*args, *(["--json"] if json_out else [])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, **tmpdir_env},
    ) as proc:
        cli_pids.append(proc.pid)
        assert proc.stdout is not None
        if json_out:  # nothing shows before the end: wait for the sandbox to run the script
            _until_running(proc.pid)
        else:
            assert proc.stdout.readline() == "started\n"  # shown live
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 5, (out, err)
    assert "ptc run: Ctrl-C: cancelling the execution (Ctrl-C again to quit at once)" in err
    if json_out:
        result = json.loads(out)
        assert (result["status"], result["stdout"]) == ("cancelled", "started\n")
    else:
        assert "status: cancelled" in err, err


def _until_running(pid: int) -> None:
    """Until a process of the `ptc` process ``pid``'s sandboxes sleeps in the kernel (the
    script's ``time.sleep``, after its print), bounded."""
    for _ in range(1200):
        for proc in Path("/proc").iterdir():
            try:
                in_sandbox = proc.name.isdigit() and f"/ptc-{pid}-" in (proc / "cgroup").read_text()
                if in_sandbox and "nanosleep" in (proc / "wchan").read_text():
                    return
            except OSError:
                continue
        time.sleep(0.05)
    raise AssertionError("the script never reached its sleep")
