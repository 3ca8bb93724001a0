"""Hostile scripts that try to reach the network or the host's sockets: none of it works.

The test opens real listeners on the host (TCP, UDP, a unix socket in the filesystem, an abstract
unix socket) and checks both sides: the script sees the exact error, the listener sees nothing.
"""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import EngineHarness


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
    clean: EngineHarness, tcp_listener: socket.socket
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
    clean: EngineHarness, udp_listener: socket.socket
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


def test_only_loopback_interface_exists_and_no_route_out(clean: EngineHarness) -> None:
    result = clean.run(
        """
import socket
print(socket.if_nameindex())
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    s.connect(("1.1.1.1", 53))
except OSError as exc:
    print("errno", exc.errno)
"""
    )
    assert (result.status, result.stdout) == ("ok", "[(1, 'lo')]\nerrno 101\n")
    clean.assert_healthy()


def test_dns_resolution_fails(clean: EngineHarness) -> None:
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


def test_host_unix_socket_in_filesystem_is_invisible(clean: EngineHarness) -> None:
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


def test_host_abstract_unix_socket_is_unreachable(clean: EngineHarness) -> None:
    name = f"\0ptc-sec-test-{id(clean)}"
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
def test_raw_sockets_are_refused(clean: EngineHarness, family: str, kind: str, proto: str) -> None:
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
