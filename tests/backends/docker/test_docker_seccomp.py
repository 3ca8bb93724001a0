"""The Docker backend's own seccomp profile, and nothing in the container but the script.

Every syscall of the process backend's deny-list fails with EPERM in a container (Debian's
Docker 20.10 default profile let `io_uring_setup` and `ptrace` through); ordinary scripts
(threads, subprocesses, asyncio) still run; and the script cannot reach an init process: there
is none, the script's own process is pid 1, and ptrace is refused anyway.

Each test runs under runc and under runsc (gVisor, backend ``gvisor``), with the same answers.
How they get there differs: runsc enforces our profile inside gVisor (`--oci-seccomp`) but answers
every refused call with EPERM whatever the profile's errno, so the runsc profile lets `clone3`
through to gVisor's own, unimplemented `clone3`, whose ENOSYS the script sees as under runc
(SECURITY.md, gVisor tier).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyseccomp

from sandbox.backends.docker.seccomp_profile import DENIED_SYSCALLS

if TYPE_CHECKING:
    from tests.backends.docker.conftest import DockerHarness


def test_every_denied_syscall_fails_with_eperm(oclean: DockerHarness) -> None:
    arch = pyseccomp.system_arch()
    numbers = {name: pyseccomp.resolve_syscall(arch, name) for name in DENIED_SYSCALLS}
    numbers = {name: number for name, number in numbers.items() if number >= 0}
    result = oclean.run(
        f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for name, number in {numbers!r}.items():
    ctypes.set_errno(0)
    rc = libc.syscall(number, 0, 0, 0, 0, 0)
    print(name, rc, ctypes.get_errno())
"""
    )
    assert (result.status, result.exit_code) == ("ok", 0), result.to_json()
    assert "seccomp:ptc" in result.isolation
    assert result.stdout.splitlines() == [f"{name} -1 1" for name in numbers]
    assert {"io_uring_setup", "ptrace", "keyctl", "bpf", "unshare"} <= set(numbers)
    oclean.assert_healthy()


def test_namespaces_stay_closed_and_clone3_says_enosys(oclean: DockerHarness) -> None:
    arch = pyseccomp.system_arch()
    clone, clone3 = (pyseccomp.resolve_syscall(arch, n) for n in ("clone", "clone3"))
    result = oclean.run(
        f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for label, args in (("clone3", ({clone3}, 0, 0)), ("clone newuser", ({clone}, 0x10000000 | 17, 0, 0, 0, 0)),
                    ("clone newnet", ({clone}, 0x40000000 | 17, 0, 0, 0, 0))):
    ctypes.set_errno(0)
    print(label, libc.syscall(*args), ctypes.get_errno())
"""
    )
    assert result.stdout.splitlines() == [
        # ENOSYS (runc: the profile's errno; gVisor: its own clone3): glibc falls back to clone,
        # whose flags the filter can see.
        "clone3 -1 38",
        "clone newuser -1 1",
        "clone newnet -1 1",
    ]
    oclean.assert_healthy()


def test_ordinary_scripts_still_run(oclean: DockerHarness) -> None:
    result = oclean.run(
        """
import asyncio, concurrent.futures, os, subprocess, sys, threading
with concurrent.futures.ThreadPoolExecutor(8) as pool:
    print(sum(pool.map(lambda n: n * n, range(100))))
print(subprocess.run([sys.executable, "-c", "print('child')"], capture_output=True,
                     text=True, check=True).stdout.strip())
pid = os.fork()
if pid == 0:
    os._exit(7)
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
async def main():
    await asyncio.gather(*(asyncio.sleep(0.01) for _ in range(10)))
    proc = await asyncio.create_subprocess_exec("true")
    return await proc.wait()
print(asyncio.run(main()))
import mmap, tempfile, time, socket
a, b = socket.socketpair(); a.send(b"x"); print(b.recv(1))
with tempfile.TemporaryFile() as f:
    f.write(b"abc"); f.flush(); print(mmap.mmap(f.fileno(), 3)[:])
"""
    )
    assert (result.status, result.exit_code, result.stderr) == ("ok", 0, "")
    assert result.stdout.splitlines() == ["328350", "child", "7", "0", "b'x'", "b'abc'"]


def test_no_init_in_reach_of_the_script(oclean: DockerHarness) -> None:
    result = oclean.run(
        """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
print("pid", os.getpid())
print("processes", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
r, w = os.pipe()
child = os.fork()
if child == 0:
    out = []
    for request in (16, 0x4206):  # PTRACE_ATTACH, PTRACE_SEIZE
        ctypes.set_errno(0)
        out.append(f"{libc.ptrace(request, 1, None, None)} {ctypes.get_errno()}")
    os.write(w, " | ".join(out).encode())
    os._exit(0)
os.close(w)
os.waitpid(child, 0)
print("ptrace pid 1 from a child", os.read(r, 200).decode())
"""
    )
    assert (result.status, result.exit_code) == ("ok", 0), result.to_json()
    assert result.stdout.splitlines() == [
        # The script's own process is the namespace's init: no docker-init (same uid, dumpable)
        # that it could stop with ptrace, read through /proc/1/mem, or make report an exit code.
        "pid 1",
        "processes [1]",
        # EPERM from the profile (ptrace is on the deny-list) for attach and seize alike.
        "ptrace pid 1 from a child -1 1 | -1 1",
    ]
    assert "init:none" in result.isolation
    oclean.assert_healthy()
