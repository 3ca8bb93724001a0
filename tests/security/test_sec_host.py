"""Hostile scripts that go after the host: its secrets, its files, its processes, privileges.

Each asserts the exact outcome the script sees and that the engine still serves afterwards.
These are the process backend's own; the cases every backend shares (host files, environment,
privileges, namespaces, the network) are in tests/conformance/test_conformance_hostile.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyseccomp
import pytest

if TYPE_CHECKING:
    from tests.conftest import EngineHarness

SECRET = "ptc-test-secret-7f3a9c"


@pytest.fixture
def host_secret(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A secret in the server's own environment, set while the engine is running."""
    monkeypatch.setenv("PTC_TEST_SECRET", SECRET)
    yield SECRET


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
