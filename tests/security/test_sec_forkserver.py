"""Hostile scripts against the fork server's new surface: the zygote every sandbox is forked from.

A sandbox is a child of a long-lived process that has imported the guest runtime. Nothing of
that process may be reachable from a script (its pid, memory, descriptors, control socket,
capabilities), nothing one execution plants may reach the next (files, memory, processes,
threads, signal handlers, patched modules), and the zygote itself never sees a script.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.conftest import EngineHarness

pytestmark = pytest.mark.requires_bwrap


def test_the_zygote_is_unreachable_from_a_script(clean: EngineHarness) -> None:
    zpid = clean.zygote_pid()
    result = clean.run(
        f"""
import ctypes, errno, os, signal
libc = ctypes.CDLL(None, use_errno=True)
def err(fn, *args):
    try:
        fn(*args)
        return "ok"
    except OSError as exc:
        return errno.errorcode[exc.errno]
print("kill", err(os.kill, {zpid}, 0))
print("pidfd", err(os.pidfd_open, {zpid}))
print("mem", err(open, "/proc/{zpid}/mem", "rb"))
print("ptrace", libc.ptrace(16, {zpid}, 0, 0), errno.errorcode[ctypes.get_errno()])
print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
"""
    )
    assert result.status == "ok", result.to_json()
    assert result.stdout.splitlines() == [
        "kill ESRCH",
        "pidfd ESRCH",
        "mem ENOENT",
        "ptrace -1 EPERM",  # PTRACE_ATTACH is filtered before the pid is even looked up
        "pids [1]",
    ]
    clean.assert_healthy()


def test_a_sandbox_holds_only_its_channel_and_stdio(clean: EngineHarness) -> None:
    result = clean.run(
        """
import os
fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
print(fds)
print(sorted(os.readlink(f"/proc/self/fd/{fd}").split(":")[0] for fd in (0, 1, 2, 3)))
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines())
for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"):
    print(key, status[key].strip())
print(open("/proc/net/unix").read().count("\\n") - 1)
"""
    )
    assert result.status == "ok", result.to_json()
    lines = result.stdout.splitlines()
    # 0-3 and the descriptor listing /proc/self/fd itself
    assert lines[0] == "[0, 1, 2, 3, 4]"
    assert lines[1] == "['/dev/null', 'pipe', 'pipe', 'socket']"
    assert lines[2:9] == [
        "CapInh 0000000000000000",
        "CapPrm 0000000000000000",
        "CapEff 0000000000000000",
        "CapBnd 0000000000000000",
        "CapAmb 0000000000000000",
        "NoNewPrivs 1",
        "Seccomp 2",
    ]
    # /proc/net/unix lists the sockets of the sandbox's own network namespace: only the
    # channel (socketpair ends are not in any namespace's list), never the zygote's.
    assert lines[9] == "0"
    clean.assert_healthy()


def test_no_new_user_namespace_by_clone(clean: EngineHarness) -> None:
    # seccomp refuses unshare(2) and setns(2); clone(CLONE_NEWUSER) is refused by the kernel's
    # per-namespace limit (max_user_namespaces 0 in the zygote's user namespace).
    result = clean.run(
        """
import ctypes, errno, signal
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER = 0x10000000
pid = libc.syscall(56, CLONE_NEWUSER | signal.SIGCHLD, 0, 0, 0, 0)  # clone on x86_64
print(pid, errno.errorcode.get(ctypes.get_errno()))
print(open("/proc/sys/user/max_user_namespaces").read().strip())
"""
    )
    assert result.status == "ok", result.to_json()
    assert result.stdout.splitlines() == ["-1 ENOSPC", "0"]
    clean.assert_healthy()


PLANT = """
import json, os, signal, subprocess, sys, threading, time
import tools
token = bytes.fromhex("{token}")
keep = bytearray(token * 65536)  # 1 MiB of the token in this sandbox's heap
open("/tmp/planted", "w").write("x")
open("/dev/shm/planted", "w").write("x")
json.PLANTED = True
tools.PLANTED = True
sys.modules["os"].PLANTED = True
signal.signal(signal.SIGUSR1, lambda *a: None)
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
subprocess.Popen(["sleep", "60"])
os.environ["PLANTED"] = "1"
print("planted")
"""

CHECK = """
import json, os, signal, sys, threading
import tools
needle = bytes.fromhex("{token}")
found = 0
for line in open("/proc/self/maps"):
    addr, perms = line.split()[:2]
    if not perms.startswith("r") or "[vvar]" in line or "[vsyscall]" in line:
        continue
    start, end = (int(x, 16) for x in addr.split("-"))
    with open("/proc/self/mem", "rb") as mem:
        try:
            mem.seek(start)
            found += mem.read(end - start).count(needle)
        except OSError:
            pass
# At least one copy is always found: the needle this script built itself (a scan that read
# nothing would say "none").
print("token copies", "many" if found > 16 else "few" if found else "none")
print(sorted(os.listdir("/tmp")), sorted(os.listdir("/dev/shm")))
print(hasattr(json, "PLANTED"), hasattr(tools, "PLANTED"), hasattr(os, "PLANTED"))
print(signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL)
print(threading.active_count(), sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
print(os.environ.get("PLANTED"))
"""


def test_nothing_one_execution_plants_reaches_the_next(clean: EngineHarness) -> None:
    token = uuid.uuid4().hex
    first = clean.run(PLANT.format(token=token))
    assert (first.status, first.stdout) == ("ok", "planted\n"), first.to_json()
    # Every idle sandbox is checked: the next execution may take any of them.
    for _ in range(clean.backend.pool.max_idle + 1):
        result = clean.run(CHECK.format(token=token))
        assert result.status == "ok", result.to_json()
        assert result.stdout.splitlines() == [
            "token copies few",  # the needle itself and its hex text: never the 1 MiB
            "['outputs'] []",  # /tmp holds only the empty outputs/ (sandbox.files)
            "False False False",
            "True",
            "1 [1]",
            "None",
        ]


def test_the_zygote_never_holds_a_script(clean: EngineHarness) -> None:
    zpid = clean.zygote_pid()
    marker = f"ptc-marker-{uuid.uuid4().hex}"
    result = clean.run(f"secret = {marker!r}\nprint(len(secret))")
    assert result.status == "ok", result.to_json()
    found = 0
    control = 0  # a text the zygote does hold: the scan must find it, or it proves nothing
    for line in Path(f"/proc/{zpid}/maps").read_text().splitlines():
        addr, perms = line.split()[:2]
        if not perms.startswith("r") or "[vsyscall]" in line or "[vvar]" in line:
            continue
        start, end = (int(x, 16) for x in addr.split("-"))
        with open(f"/proc/{zpid}/mem", "rb") as mem:
            try:
                mem.seek(start)
                region = mem.read(end - start)
            except OSError:
                continue
            found += region.count(marker.encode())
            control += region.count(b"_ptc_runtime")
    assert control > 0
    assert found == 0


@pytest.mark.parametrize(
    "script, status, exit_code",
    [
        (
            "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nprint('parent done')",
            "ok",
            0,
        ),
        (
            "import threading, time\n"
            "threading.Thread(target=time.sleep, args=(60,)).start()\n"
            "import os; os._exit(0)",
            "error",  # no end report: the host saw a clean exit it cannot vouch for
            0,
        ),
        # The script is its pid namespace's init, which ignores its own SIGABRT; glibc's abort()
        # then executes `hlt`, which faults in user mode (x86_64): SIGSEGV.
        ("import os\nos.abort()", "error", -11),
        ("import ctypes\nctypes.string_at(0)", "error", -11),
    ],
    ids=["forked-child", "running-thread", "abort", "segfault"],
)
def test_children_threads_and_crashes_leave_nothing(
    clean: EngineHarness, script: str, status: str, exit_code: int
) -> None:
    result = clean.run(script)
    assert (result.status, result.exit_code) == (status, exit_code), result.to_json()
    assert result.violations == []
    clean.assert_healthy()
