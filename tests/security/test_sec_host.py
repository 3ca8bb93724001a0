"""Hostile scripts that go after the host: its secrets, its files, its processes, privileges.

Each asserts the exact outcome the script sees and that the engine still serves afterwards.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyseccomp
import pytest

if TYPE_CHECKING:
    from conftest import EngineHarness

ROOT = Path(__file__).resolve().parents[2]
SECRET = "ptc-test-secret-7f3a9c"


@pytest.fixture
def host_secret(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A secret in the server's own environment, set while the engine is running."""
    monkeypatch.setenv("PTC_TEST_SECRET", SECRET)
    yield SECRET


def test_etc_shadow_is_not_there(clean: EngineHarness) -> None:
    result = clean.run("print(open('/etc/shadow').read())")
    assert result.status == "error"
    assert result.error is not None
    assert (result.error.type, result.error.line) == ("FileNotFoundError", 1)
    assert "/etc/shadow" in result.error.message
    assert result.stdout == ""
    clean.assert_healthy()


def test_host_environment_is_invisible(clean: EngineHarness, host_secret: str) -> None:
    assert os.environ["PTC_TEST_SECRET"] == host_secret
    result = clean.run(
        """
import os
print(sorted(os.environ))
for pid in ("self", "1"):
    print(open(f"/proc/{pid}/environ", "rb").read())
"""
    )
    assert result.status == "ok"
    lines = result.stdout.splitlines()
    assert lines[0] == "['HOME', 'LANG', 'PATH', 'PWD']"
    assert host_secret not in result.stdout
    assert "PTC_TEST_SECRET" not in result.stdout
    clean.assert_healthy()


def test_proc_1_is_the_guest_itself_not_the_host(clean: EngineHarness, host_secret: str) -> None:
    result = clean.run(
        """
import os
print(os.getpid())
print(open("/proc/1/environ", "rb").read())
print(sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
"""
    )
    assert result.status == "ok"
    pid, environ, pids = result.stdout.splitlines()
    assert pid == "1"  # bwrap --as-pid-1: the guest is the namespace's init
    assert environ == "b'PATH=/usr/bin:/bin\\x00HOME=/tmp\\x00LANG=C.UTF-8\\x00PWD=/tmp\\x00'"
    assert pids == "[1]"  # no bwrap reaper, and no host process is visible
    assert host_secret not in result.stdout
    clean.assert_healthy()


def test_server_files_are_not_mounted(clean: EngineHarness) -> None:
    targets = [
        str(ROOT / "pyproject.toml"),
        str(ROOT / "sandbox" / "engine.py"),
        str(Path(sys.prefix) / "pyvenv.cfg"),
        os.path.realpath(sys.executable),
        "/root",
        "/etc/passwd",
        "/home",
        "/var/lib",
    ]
    result = clean.run(
        f"""
import os
for path in {targets!r}:
    print(os.path.exists(path))
print(sorted(os.listdir("/")))
"""
    )
    assert result.status == "ok"
    *exists, root = result.stdout.splitlines()
    assert exists == ["False"] * len(targets)
    assert root == "['bin', 'dev', 'lib', 'lib64', 'proc', 'ptc', 'sbin', 'tmp', 'usr']"
    clean.assert_healthy()


def test_writing_outside_tmp_fails_read_only(clean: EngineHarness) -> None:
    result = clean.run(
        """
for path in ("/x", "/usr/x", "/usr/lib/python3/x", "/ptc/bootstrap.py", "/ptc/x", "/bin/x",
             "/dev/x", "/dev/shm/../x"):
    try:
        with open(path, "w") as f:
            f.write("owned")
        print("wrote", path)
    except OSError as exc:
        print(exc.errno)
with open("/tmp/ok", "w") as f:
    f.write("fine")
print(open("/tmp/ok").read())
"""
    )
    assert result.status == "ok"
    assert result.stdout.splitlines() == ["30"] * 8 + ["fine"]  # EROFS everywhere but /tmp
    clean.assert_healthy()


def test_dev_is_read_only_but_devices_and_shared_memory_work(clean: EngineHarness) -> None:
    result = clean.run(
        """
import multiprocessing, os
with open("/dev/shm/mine", "w") as f:
    f.write("shared")
lock = multiprocessing.Lock()  # a POSIX semaphore in /dev/shm
with lock:
    print(os.listdir("/dev/shm"), open("/dev/null", "w").write("xyz"))
print(len(open("/dev/urandom", "rb").read(16)), open("/dev/zero", "rb").read(2))
"""
    )
    assert result.status == "ok", result.to_json()
    assert result.stdout.splitlines() == ["['mine'] 3", "16 b'\\x00\\x00'"]
    clean.assert_healthy()


def test_runtime_files_are_unchanged_after_an_attempt(clean: EngineHarness) -> None:
    before = {p.name: p.read_bytes() for p in clean.runtime_dir.iterdir()}
    result = clean.run(
        "import os\ntry:\n    os.chmod('/ptc/bootstrap.py', 0o777)\nexcept OSError as e:\n    print(e.errno)"
    )
    assert (result.status, result.stdout) == ("ok", "30\n")
    assert {p.name: p.read_bytes() for p in clean.runtime_dir.iterdir()} == before
    clean.assert_healthy()


def test_no_capabilities_and_an_unprivileged_uid(clean: EngineHarness) -> None:
    result = clean.run(
        """
import os
caps = [l.split()[1] for l in open("/proc/self/status") if l.startswith("Cap")]
print(os.getuid(), os.geteuid(), os.getgid(), caps)
"""
    )
    assert result.status == "ok"
    assert result.stdout == f"65534 65534 65534 {['0000000000000000'] * 5}\n"
    clean.assert_healthy()


def test_setuid_and_setgid_to_root_fail(clean: EngineHarness) -> None:
    result = clean.run(
        """
import os
for fn in (os.setuid, os.seteuid, os.setgid, os.setegid):
    try:
        fn(0)
        print("became root")
    except OSError as exc:
        print(fn.__name__, exc.errno)
try:
    os.setgroups([0])
except OSError as exc:
    print("setgroups", exc.errno)
"""
    )
    # uid/gid 0 is not mapped in the sandbox's user namespace (EINVAL); setgroups needs a
    # capability the sandbox does not hold (EPERM).
    assert result.status == "ok"
    assert result.stdout.splitlines() == [
        "setuid 22",
        "seteuid 22",
        "setgid 22",
        "setegid 22",
        "setgroups 1",
    ]
    clean.assert_healthy()


def test_ptrace_cannot_reach_any_host_process(clean: EngineHarness) -> None:
    host_pid = os.getpid()  # this test process, by its host pid number
    result = clean.run(
        f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206
for request in (PTRACE_ATTACH, PTRACE_SEIZE):
    rc = libc.ptrace(request, {host_pid}, 0, 0)
    print(rc, ctypes.get_errno())
try:
    open("/proc/{host_pid}/mem", "rb")
except OSError as exc:
    print("mem", exc.errno)
"""
    )
    # The syscall filter refuses ptrace itself (EPERM); were it let through, the host's
    # processes would not exist in the sandbox's pid namespace anyway (ENOENT for /proc).
    assert result.status == "ok"
    assert result.stdout.splitlines() == ["-1 1", "-1 1", "mem 2"]
    clean.assert_healthy()


def test_signals_to_parent_and_to_all_reach_nothing_outside(clean: EngineHarness) -> None:
    result = clean.run(
        """
import os, signal
print("ppid", os.getppid())
for pid in (os.getppid(), -1):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
            print(pid, "sent")
        except OSError as exc:
            print(pid, exc.errno)
print("alive")
"""
    )
    # The script is the namespace's init (pid 1) and its parent is outside the namespace, so
    # getppid() is 0 and kill(0) targets the script's own process group: init ignores signals
    # without a handler from inside its namespace. -1 reaches every process the script may
    # signal except itself: none (ESRCH). Nothing outside is reachable.
    assert result.status == "ok"
    assert result.stdout.splitlines() == [
        "ppid 0",
        "0 sent",
        "0 sent",
        "-1 3",
        "-1 3",
        "alive",
    ]
    clean.assert_healthy()


UNSHARE_FLAGS = {
    "user": 0x10000000,
    "mount": 0x00020000,
    "net": 0x40000000,
    "pid": 0x20000000,
    "ipc": 0x08000000,
    "uts": 0x04000000,
    "cgroup": 0x02000000,
}


def test_namespace_creation_fails(clean: EngineHarness) -> None:
    result = clean.run(
        f"""
import ctypes, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
# unshare(2) from a single-threaded child: the guest itself runs a channel reader thread.
for name, flag in {UNSHARE_FLAGS!r}.items():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        rc = libc.unshare(flag)
        os.write(w, f"{{name}} {{rc}} {{ctypes.get_errno()}}".encode())
        os._exit(0)
    os.waitpid(pid, 0)
    print(os.read(r, 100).decode())
proc = subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True)
print("unshare(1)", proc.returncode)
"""
    )
    assert result.status == "ok"
    # The syscall filter refuses unshare(2) (EPERM). Behind it, a nested user namespace is
    # disabled (bwrap --disable-userns) and every other one needs CAP_SYS_ADMIN, which the
    # sandbox does not hold.
    assert result.stdout.splitlines() == [
        "user -1 1",
        "mount -1 1",
        "net -1 1",
        "pid -1 1",
        "ipc -1 1",
        "uts -1 1",
        "cgroup -1 1",
        "unshare(1) 1",
    ]
    clean.assert_healthy()


FILTERED = ["keyctl", "add_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
            "process_vm_readv", "open_by_handle_at", "init_module", "kexec_load", "setns",
            "fsopen", "clock_settime", "syslog"]  # fmt: skip


def test_syscall_filter_refuses_the_kernels_riskiest_interfaces(clean: EngineHarness) -> None:
    arch = pyseccomp.system_arch()
    numbers = {name: pyseccomp.resolve_syscall(arch, name) for name in [*FILTERED, "getppid"]}
    result = clean.run(
        f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for name, number in {numbers!r}.items():
    ctypes.set_errno(0)
    rc = libc.syscall(number, 0, 0, 0, 0, 0)
    print(name, rc, ctypes.get_errno())
"""
    )
    assert result.status == "ok"
    assert "seccomp" in result.isolation
    # Every filtered call fails with EPERM whatever its arguments; an allowed one still runs
    # (getppid is 0: the script is its namespace's init).
    assert result.stdout.splitlines() == [*(f"{name} -1 1" for name in FILTERED), "getppid 0 0"]
    clean.assert_healthy()


def test_mount_fails(clean: EngineHarness) -> None:
    result = clean.run(
        """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
rc = libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)
print(rc, ctypes.get_errno())
"""
    )
    assert (result.status, result.stdout) == ("ok", "-1 1\n")
    clean.assert_healthy()


def test_executions_do_not_see_each_others_files(clean: EngineHarness) -> None:
    first = clean.run("open('/tmp/left-behind', 'w').write('x'); print('ok')")
    second = clean.run("import os; print(os.listdir('/tmp'))")
    assert (first.status, second.status, second.stdout) == ("ok", "ok", "[]\n")
    clean.assert_healthy()
