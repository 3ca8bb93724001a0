"""Hostile scripts on the container backend: the same outcomes, statuses and violation names as
on the process backend, nothing left behind, and the next execution still works."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from sandbox.result import ExecutionResult

    from .conftest import DockerHarness

MiB = 1 << 20


def tripped(result: ExecutionResult) -> list[tuple[str, float, str]]:
    return [(v.limit, v.limit_value, v.action) for v in result.violations]


def test_print_runs_in_the_container(dclean: DockerHarness) -> None:
    result = dclean.run(
        "import os, socket\nprint(1, os.getuid(), socket.gethostname())\n"
        "import sys; print('err', file=sys.stderr)"
    )
    assert (result.status, result.exit_code) == ("ok", 0)
    assert result.stdout == "1 65532 sandbox\n"
    assert result.stderr == "err\n"
    assert result.backend == "docker"
    assert {"container", "netns:none", "caps:none", "seccomp:ptc", "init:none"} <= set(
        result.isolation
    )


def test_tool_calls_go_through_the_broker(dclean: DockerHarness) -> None:
    manifest = [
        {
            "name": "add",
            "description": "adds",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}},
                "required": ["a"],
            },
        }
    ]
    result = dclean.run(
        "import tools\nfor i in range(3):\n    print(tools.add(a=i))", manifest=manifest
    )
    assert result.status == "ok", result.stderr
    assert [c.tool for c in result.calls] == ["add", "add", "add"]
    assert [c.arguments for c in result.calls] == [{"a": 0}, {"a": 1}, {"a": 2}]


def test_script_error_and_exit_codes(dclean: DockerHarness) -> None:
    result = dclean.run("x = 1\nraise ValueError('nope')")
    assert (result.status, result.exit_code) == ("error", 1)
    assert result.error is not None and (result.error.type, result.error.line) == ("ValueError", 2)
    result = dclean.run("import sys\nsys.exit(7)")
    assert (result.status, result.exit_code) == ("error", 7)


def test_network_attempt_fails(dclean: DockerHarness) -> None:
    result = dclean.run(
        """
import socket
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2)
    print("connected")
except OSError as exc:
    print("errno", exc.errno)
print(sorted(name for _, name in socket.if_nameindex()))
"""
    )
    assert result.status == "ok"
    assert result.stdout == "errno 101\n['lo']\n"


def test_sleep_past_the_wall_limit(dclean: DockerHarness) -> None:
    result = dclean.run(
        "import time\nprint('before', flush=True)\ntime.sleep(60)", limits={"wall_time": 1}
    )
    assert result.status == "limit_exceeded"
    assert tripped(result) == [("wall_time", 1.0, "killed")]
    assert result.stdout == "before\n"
    assert result.exit_code == -9
    dclean.assert_healthy()


def test_busy_loop(dclean: DockerHarness) -> None:
    result = dclean.run("while True:\n    pass", limits={"cpu_time": 1})
    assert result.status == "limit_exceeded"
    assert tripped(result) == [("cpu_time", 1.0, "killed")]
    assert result.violations[0].observed >= 1.0
    assert result.exit_code == -9
    dclean.assert_healthy()


def test_memory_bomb_is_killed_by_the_engine(dclean: DockerHarness) -> None:
    result = dclean.run(
        "hoard = []\nwhile True:\n    hoard.append(bytearray(8 * 1024 * 1024))",
        limits={"memory": 128 * MiB},
    )
    assert result.status == "limit_exceeded"
    assert tripped(result) == [("memory", 128 * MiB, "killed")]
    assert result.exit_code == -9
    dclean.assert_healthy()


def test_memory_bomb_spread_over_processes(dclean: DockerHarness) -> None:
    result = dclean.run(
        """
import os, time
for _ in range(4):
    if os.fork() == 0:
        block = bytearray(48 * 1024 * 1024)
        time.sleep(30)
        os._exit(0)
time.sleep(30)
""",
        limits={"memory": 128 * MiB, "wall_time": 5},
    )
    assert result.status == "limit_exceeded"
    assert ("memory", 128 * MiB, "killed") in tripped(result)
    dclean.assert_healthy()


def test_fork_bomb(dclean: DockerHarness) -> None:
    result = dclean.run(
        """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
""",
        limits={"wall_time": 2, "processes": 32},
    )
    assert result.status == "limit_exceeded"
    assert tripped(result) == [("wall_time", 2.0, "killed"), ("processes", 32, "refused")]
    assert result.exit_code == -9
    dclean.assert_healthy()


def test_thread_bomb(dclean: DockerHarness) -> None:
    result = dclean.run(
        """
import threading, time
while True:
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
""",
        limits={"processes": 40},
    )
    assert result.status == "limit_exceeded"
    assert tripped(result) == [("processes", 40, "refused")]
    assert result.error is not None and result.error.type == "RuntimeError"
    dclean.assert_healthy()


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_output_flood_is_cut_with_a_marker(dclean: DockerHarness, stream: str) -> None:
    cap = 64 * 1024
    result = dclean.run(
        f"import sys\nfor _ in range(1024):\n    print('x' * 1023, file=sys.{stream})",
        limits={f"{stream}_bytes": cap},
    )
    assert result.status == "limit_exceeded"
    assert tripped(result) == [(f"{stream}_bytes", cap, "truncated")]
    assert result.violations[0].observed == MiB
    text = result.stdout if stream == "stdout" else result.stderr
    assert text.endswith(
        f"\n[ptc: {stream} truncated: {MiB - cap} bytes dropped of {MiB}; the cap is {cap} bytes]\n"
    )


def test_writing_outside_tmp_fails(dclean: DockerHarness) -> None:
    result = dclean.run(
        """
import errno
for path in ("/etc/x", "/ptc/bootstrap.py", "/usr/x", "/run/ptc/x", "/x"):
    try:
        open(path, "w").write("x")
        print(path, "written")
    except OSError as exc:
        print(path, errno.errorcode[exc.errno])
open("/tmp/ok", "w").write("fine")
print(open("/tmp/ok").read())
"""
    )
    assert result.status == "ok", result.stderr
    lines = result.stdout.splitlines()
    assert all(line.split()[1] in ("EROFS", "EACCES") for line in lines[:-1]), lines
    assert lines[-1] == "fine"


def test_file_bigger_than_the_limit(dclean: DockerHarness) -> None:
    result = dclean.run(
        "with open('/tmp/big', 'wb') as f:\n    f.write(b'x' * (2 * 1024 * 1024))",
        limits={"file_size": MiB},
    )
    assert result.status == "limit_exceeded"
    assert tripped(result) == [("file_size", MiB, "refused")]
    dclean.assert_healthy()


def test_no_capabilities_and_no_new_privileges(dclean: DockerHarness) -> None:
    result = dclean.run(
        """
caps = [l.split()[1] for l in open("/proc/self/status") if l.startswith(("CapEff", "CapPrm", "CapBnd"))]
nnp = [l.split()[1] for l in open("/proc/self/status") if l.startswith("NoNewPrivs")]
seccomp = [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")]
print(caps, nnp, seccomp)
"""
    )
    assert (
        result.stdout
        == "['0000000000000000', '0000000000000000', '0000000000000000'] ['1'] ['2']\n"
    )


def test_host_environment_is_invisible(dclean: DockerHarness) -> None:
    result = dclean.run("import os\nprint(sorted(os.environ))")
    assert result.status == "ok"
    assert "DOCKER_HOST" not in result.stdout and "PTC_DOCKER_HOST" not in result.stdout
