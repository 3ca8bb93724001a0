"""Hostile scripts that go after the host, on every backend: its secrets, its files, its
processes, its privileges, its network and sockets. Each asserts the exact outcome the script
sees and that the engine still serves afterwards.

Where the backends legitimately differ (the sandbox's uid, what its root holds), the expected
value is per backend, with the reason next to it. The network tests open real listeners on the
host (TCP, UDP, a unix socket in the filesystem, an abstract unix socket) and check both sides:
the script sees the exact error, the listener sees nothing.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox.backends.process.uid_range import DEFAULT_COUNT, DEFAULT_FIRST

if TYPE_CHECKING:
    from .conftest import Harness

ROOT = Path(__file__).resolve().parents[2]
SECRET = "ptc-test-secret-7f3a9c"


@pytest.fixture
def host_secret(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A secret in the server's own environment, set while the engine is running."""
    monkeypatch.setenv("PTC_TEST_SECRET", SECRET)
    yield SECRET


# -- the host's files and secrets ---------------------------------------------------------------


def test_etc_shadow_is_not_readable(clean: Harness) -> None:
    result = clean.run("print(open('/etc/shadow').read())")
    assert result.status == "error"
    assert result.error is not None
    assert (result.error.type, result.error.line) == (ETC_SHADOW[clean.name], 1)
    assert "/etc/shadow" in result.error.message
    assert result.stdout == ""
    clean.assert_healthy()


ETC_SHADOW = {
    # The process sandbox mounts no /etc at all.
    "process": "FileNotFoundError",
    # The runtime image has its own /etc/shadow (root-only, no secrets of the host's).
    "docker": "PermissionError",
}
ETC_SHADOW["gvisor"] = ETC_SHADOW["docker"]  # the same container, under gVisor


def test_host_environment_is_invisible(clean: Harness, host_secret: str) -> None:
    assert os.environ["PTC_TEST_SECRET"] == host_secret
    result = clean.run(
        """
import os
print(sorted(os.environ))
print(open("/proc/self/environ", "rb").read())
"""
    )
    assert result.status == "ok"
    names, _environ = result.stdout.splitlines()
    assert names == ENVIRONMENT[clean.name]
    assert host_secret not in result.stdout
    assert "PTC_TEST_SECRET" not in result.stdout
    assert "DOCKER_HOST" not in result.stdout
    clean.assert_healthy()


ENVIRONMENT = {
    # bwrap --clearenv, then only what the bootstrap needs.
    "process": "['HOME', 'LANG', 'PATH', 'PWD']",
    # The container's environment is the runtime image's ENV and the hostname Docker sets.
    "docker": "['HOME', 'HOSTNAME', 'LANG', 'PATH', 'PYTHONDONTWRITEBYTECODE']",
}
ENVIRONMENT["gvisor"] = ENVIRONMENT["docker"]  # the same container, under gVisor


def test_server_files_are_not_mounted(clean: Harness) -> None:
    targets = [
        str(ROOT / "pyproject.toml"),
        str(ROOT / "sandbox" / "engine.py"),
        str(Path(sys.prefix) / "pyvenv.cfg"),
        os.path.realpath(sys.executable),
        "/root/.bashrc",
        "/var/lib/docker",
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
    assert root == ROOT_LISTING[clean.name]
    clean.assert_healthy()


ROOT_LISTING = {
    # The process sandbox binds only the host's runtime directories, read-only.
    "process": "['bin', 'dev', 'lib', 'lib64', 'proc', 'ptc', 'sbin', 'tmp', 'usr']",
    # A container's root is the runtime image's own file system.
    "docker": "['.dockerenv', 'bin', 'boot', 'dev', 'etc', 'home', 'lib', 'lib64', 'media', "
    "'mnt', 'opt', 'proc', 'ptc', 'root', 'run', 'sbin', 'srv', 'sys', 'tmp', 'usr', 'var']",
}
ROOT_LISTING["gvisor"] = ROOT_LISTING["docker"]  # the same container, under gVisor


def test_writing_outside_tmp_fails(clean: Harness) -> None:
    result = clean.run(
        """
import errno
for path in ("/x", "/usr/x", "/usr/lib/python3/x", "/ptc/bootstrap.py", "/ptc/x", "/bin/x",
             "/dev/x", "/dev/shm/../x", "/etc/x"):
    try:
        with open(path, "w") as f:
            f.write("owned")
        print(path, "written")
    except OSError as exc:
        print(path, errno.errorcode[exc.errno])
with open("/tmp/ok", "w") as f:
    f.write("fine")
print(open("/tmp/ok").read())
"""
    )
    assert result.status == "ok"
    assert result.stdout.splitlines() == [*WRITE_OUTSIDE_TMP[clean.name], "fine"]
    clean.assert_healthy()


_READ_ONLY = ["/x", "/usr/x", "/usr/lib/python3/x", "/ptc/bootstrap.py", "/ptc/x", "/bin/x"]
WRITE_OUTSIDE_TMP = {
    # One read-only root; /dev is read-only too (device nodes only) and there is no /etc.
    "process": [
        *(f"{path} EROFS" for path in [*_READ_ONLY, "/dev/x", "/dev/shm/../x"]),
        "/etc/x ENOENT",
    ],
    # A read-only root file system; Docker's /dev is a tmpfs of root's that the sandbox's
    # unprivileged uid may not write to.
    "docker": [
        *(f"{path} EROFS" for path in _READ_ONLY),
        "/dev/x EACCES",
        "/dev/shm/../x EACCES",
        "/etc/x EROFS",
    ],
}
# gVisor's file system checks the unprivileged uid's permission before the mount's read-only
# flag, so every refusal is EACCES: still refused, by gVisor's kernel rather than the host's.
WRITE_OUTSIDE_TMP["gvisor"] = [
    f"{path} EACCES" for path in [*_READ_ONLY, "/dev/x", "/dev/shm/../x", "/etc/x"]
]


# -- privileges -------------------------------------------------------------------------------


def test_no_capabilities_no_new_privileges_and_an_unprivileged_uid(clean: Harness) -> None:
    result = clean.run(
        """
import os
status = [l.split()[1] for l in open("/proc/self/status")
          if l.startswith(("Cap", "NoNewPrivs", "Seccomp:"))]
print(os.getuid(), os.geteuid(), os.getgid(), status)
"""
    )
    assert result.status == "ok"
    uid = SANDBOX_UID[clean.name]
    named = int(next(i for i in result.isolation if i.startswith("uid:")).split(":")[1])
    if clean.name == "process" and named in range(DEFAULT_FIRST, DEFAULT_FIRST + DEFAULT_COUNT):
        # One uid per sandbox where the host has a range (issue 39): the one its result names,
        # of the range, which no other live sandbox has; nobody where the host has none.
        uid = named
    # Five capability sets all empty, no_new_privs set, a seccomp filter installed. gVisor's
    # /proc/self/status has neither CapAmb nor NoNewPrivs lines: four empty sets and the filter
    # (our profile, enforced by gVisor: --oci-seccomp in scripts/dockerd.sh).
    status = ["0000000000000000"] * 5 + ["1", "2"]
    if clean.name == "gvisor":
        status = ["0000000000000000"] * 4 + ["2"]
    assert result.stdout == f"{uid} {uid} {uid} {status}\n"
    clean.assert_healthy()


SANDBOX_UID = {
    "process": 65534,  # nobody, mapped in the sandbox's user namespace, where it has no range
    "docker": 65532,  # the runtime image's own unprivileged user
}
SANDBOX_UID["gvisor"] = SANDBOX_UID["docker"]  # the same container, under gVisor


def test_setuid_and_setgid_to_root_fail(clean: Harness) -> None:
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
    assert result.status == "ok"
    errno = SETUID_ERRNO[clean.name]
    assert result.stdout.splitlines() == [
        f"setuid {errno}",
        f"seteuid {errno}",
        f"setgid {errno}",
        f"setegid {errno}",
        "setgroups 1",  # EPERM: CAP_SETGID is not held
    ]
    clean.assert_healthy()


SETUID_ERRNO = {
    # uid/gid 0 is not mapped in the sandbox's user namespace: EINVAL.
    "process": 22,
    # uid 0 exists in the container, but changing to it needs CAP_SETUID/CAP_SETGID: EPERM.
    "docker": 1,
}
SETUID_ERRNO["gvisor"] = SETUID_ERRNO["docker"]  # the same container, under gVisor


def test_ptrace_cannot_reach_any_host_process(clean: Harness) -> None:
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


UNSHARE_FLAGS = {
    "user": 0x10000000,
    "mount": 0x00020000,
    "net": 0x40000000,
    "pid": 0x20000000,
    "ipc": 0x08000000,
    "uts": 0x04000000,
    "cgroup": 0x02000000,
}


def test_namespace_creation_fails(clean: Harness) -> None:
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
    # disabled (process: bwrap --disable-userns) and every other one needs CAP_SYS_ADMIN,
    # which the sandbox does not hold.
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


def test_mount_fails(clean: Harness) -> None:
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


def test_executions_do_not_see_each_others_files(clean: Harness) -> None:
    first = clean.run("open('/tmp/left-behind', 'w').write('x'); print('ok')")
    second = clean.run("import os; print(os.listdir('/tmp'))")
    # Only the empty outputs/ directory every execution starts with (sandbox.files).
    assert (first.status, second.status, second.stdout) == ("ok", "ok", "['outputs']\n")
    clean.assert_healthy()


# -- the network and the host's sockets -------------------------------------------------------


@pytest.fixture
def tcp_listener() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


@pytest.fixture
def udp_listener() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    yield sock
    sock.close()


def _nothing_arrived(sock: socket.socket, kind: str) -> None:
    with pytest.raises(BlockingIOError):
        if kind == "stream":
            conn, _ = sock.accept()
            conn.close()
        else:
            sock.recvfrom(65536)


def test_tcp_to_host_loopback_listener_is_refused(
    clean: Harness, tcp_listener: socket.socket
) -> None:
    port = tcp_listener.getsockname()[1]
    result = clean.run(
        f"""
import socket
s = socket.socket()
s.settimeout(2)
try:
    s.connect(("127.0.0.1", {port}))
    print("connected")
except OSError as exc:
    print("errno", exc.errno)
"""
    )
    assert (result.status, result.stdout, result.violations) == ("ok", "errno 111\n", [])
    _nothing_arrived(tcp_listener, "stream")
    clean.assert_healthy()


def test_udp_to_host_loopback_listener_never_arrives(
    clean: Harness, udp_listener: socket.socket
) -> None:
    port = udp_listener.getsockname()[1]
    result = clean.run(
        f"""
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(20):
    s.sendto(b"exfiltrate", ("127.0.0.1", {port}))
print("sent")
"""
    )
    # The datagrams go to the sandbox's own, empty loopback, not to the host's.
    assert (result.status, result.stdout) == ("ok", "sent\n")
    _nothing_arrived(udp_listener, "dgram")
    clean.assert_healthy()


def test_only_loopback_interface_exists_and_no_route_out(clean: Harness) -> None:
    result = clean.run(
        """
import socket
print(socket.if_nameindex())
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    s.connect(("1.1.1.1", 53))
except OSError as exc:
    print("errno", exc.errno)
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2)
    print("connected")
except OSError as exc:
    print("errno", exc.errno)
"""
    )
    # ENETUNREACH; gVisor's network stack (loopback only: --network=none) says EHOSTUNREACH.
    errno = 113 if clean.name == "gvisor" else 101
    assert (result.status, result.stdout) == ("ok", f"[(1, 'lo')]\nerrno {errno}\nerrno {errno}\n")
    clean.assert_healthy()


def test_dns_resolution_fails(clean: Harness) -> None:
    result = clean.run(
        """
import socket
try:
    socket.getaddrinfo("example.com", 443)
    print("resolved")
except socket.gaierror as exc:
    print("gaierror", exc.errno)
"""
    )
    assert (result.status, result.stdout) == ("ok", f"gaierror {socket.EAI_AGAIN}\n")
    clean.assert_healthy()


def test_host_unix_socket_in_filesystem_is_invisible(clean: Harness) -> None:
    with tempfile.TemporaryDirectory(prefix="sec-unix-") as tmp:
        path = Path(tmp) / "host.sock"
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        server.listen(1)
        server.setblocking(False)
        try:
            result = clean.run(
                f"""
import socket
for target in ({str(path)!r}, "/var/run/docker.sock", "/run/systemd/private"):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(target)
        print("connected", target)
    except OSError as exc:
        print(exc.errno)
"""
            )
            assert (result.status, result.stdout) == ("ok", "2\n2\n2\n")
            _nothing_arrived(server, "stream")
        finally:
            server.close()
    clean.assert_healthy()


def test_host_abstract_unix_socket_is_unreachable(clean: Harness) -> None:
    name = f"\0ptc-sec-test-{os.getpid()}-{clean.name}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(name)
    server.listen(1)
    server.setblocking(False)
    try:
        result = clean.run(
            f"""
import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect({name!r})
    print("connected")
except OSError as exc:
    print(exc.errno)
"""
        )
        # Abstract names live in the network namespace: the sandbox has its own, empty one.
        assert (result.status, result.stdout) == ("ok", "111\n")
        _nothing_arrived(server, "stream")
    finally:
        server.close()
    clean.assert_healthy()


@pytest.mark.parametrize(
    ("family", "kind", "proto"),
    [
        ("AF_INET", "SOCK_RAW", "IPPROTO_ICMP"),
        ("AF_INET", "SOCK_RAW", "IPPROTO_RAW"),
        ("AF_PACKET", "SOCK_RAW", "0"),
    ],
    ids=["raw-icmp", "raw-ip", "packet"],
)
def test_raw_sockets_are_refused(clean: Harness, family: str, kind: str, proto: str) -> None:
    proto_expr = proto if proto == "0" else f"socket.{proto}"
    result = clean.run(
        f"""
import socket
try:
    socket.socket(socket.{family}, socket.{kind}, {proto_expr})
    print("opened")
except OSError as exc:
    print(exc.errno)
"""
    )
    assert (result.status, result.stdout) == ("ok", "1\n")  # EPERM: no CAP_NET_RAW
    clean.assert_healthy()
