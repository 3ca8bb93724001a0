"""A fleet behind a real load balancer, for tests: N `ptc serve` on one PostgreSQL and nginx.

`Fleet` starts N real ``ptc serve`` processes on ephemeral loopback ports, all on one PostgreSQL
schema (the ``pg_url`` fixture) with distinct ``--instance-id``s (``fleet-0``, ``fleet-1``, ...),
any of which a test may kill with SIGKILL (`Fleet.kill`). `nginx` runs the shipped
configuration, deploy/nginx/ptc.conf, in front of them on an ephemeral loopback port, in its own
temporary prefix (configuration, pid file, logs), stopped and removed when the test ends.

The configuration the test runs is the shipped file with only these substitutions, each of
which must match exactly once (so a change to the shipped file that a test would silently stop
covering fails here instead): the upstream's ``server`` lines (the fleet's addresses), the
``listen`` address (127.0.0.1 and a free port), the ``pid``, ``error_log`` and ``access_log``
paths (into the prefix), and, when a test asks for it, the value of one timeout directive
(`nginx(..., timeouts={"grpc_read_timeout": "3s"})`); a test that measures what a setting fixes
may also drop it (`nginx(..., drop=("client_max_body_size",))`), leaving nginx's default.

The fixtures (tests/fleet/conftest.py) are ``fleet`` (three servers) and ``balancer`` (nginx in
front of them); tests of other fleet behaviour (sessions carried between servers, a server that
dies mid-conversation) can go through the same two.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from tests.ptc_serve import ROOT, start_serve, stop_serve

__all__ = ["SHIPPED_CONFIG", "Balancer", "Fleet", "nginx", "render_config"]

SHIPPED_CONFIG = ROOT / "deploy" / "nginx" / "ptc.conf"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
START_TIMEOUT_S = 30.0


@dataclass
class Fleet:
    """N servers on one PostgreSQL schema; ``procs[i]`` listens on ``addresses[i]`` and
    records its executions with instance ``fleet-{i}``."""

    url: str
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    stderrs: list[str] = field(default_factory=list)

    def instance(self, index: int) -> str:
        return f"fleet-{index}"

    def sql(self, query: str, params: Sequence[object] = ()) -> list[tuple[object, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn, conn.cursor() as cursor:
            cursor.execute(query, params)
            return list(cursor.fetchall()) if cursor.description else []

    def kill(self, index: int) -> None:
        """SIGKILL: the server dies at once, with whatever it was running."""
        self.procs[index].kill()
        self.procs[index].wait(timeout=30)

    def index_of(self, instance: str) -> int:
        return int(instance.removeprefix("fleet-"))


@contextlib.contextmanager
def fleet(url: str, size: int = 3, args: Sequence[str] = ()) -> Iterator[Fleet]:
    """``size`` servers on the PostgreSQL schema ``url``; each stopped with SIGTERM at the end
    (a killed one is only reaped). A server that was not killed must stop cleanly: exit code 0
    and no traceback."""
    running = Fleet(url)
    try:
        for index in range(size):
            proc, serving = start_serve(
                "--audit-db", url, "--instance-id", running.instance(index), *args
            )
            running.procs.append(proc)
            running.addresses.append(serving.address)
        yield running
    finally:
        killed = [proc.returncode == -signal.SIGKILL for proc in running.procs]
        running.stderrs = [stop_serve(proc, 60) for proc in running.procs]
    for proc, was_killed, stderr in zip(running.procs, killed, running.stderrs, strict=True):
        if not was_killed:
            assert proc.returncode == 0, stderr
            assert "Traceback" not in stderr, stderr


@dataclass
class Balancer:
    address: str  # 127.0.0.1:port, the one address clients use
    prefix: Path
    config: str  # the configuration it runs, as rendered
    proc: subprocess.Popen[bytes]

    def access_log(self) -> str:
        return (self.prefix / "access.log").read_text()

    def error_log(self) -> str:
        return (self.prefix / "error.log").read_text()


def _substitute(text: str, pattern: str, replacement: str) -> str:
    found = re.findall(pattern, text, flags=re.MULTILINE)
    assert len(found) == 1, f"the shipped config has {len(found)} lines matching {pattern!r}"
    return re.sub(pattern, lambda _m: replacement, text, flags=re.MULTILINE)


def render_config(
    upstreams: Sequence[str],
    listen: str,
    prefix: Path,
    timeouts: Mapping[str, str] | None = None,
    drop: Sequence[str] = (),
) -> str:
    """deploy/nginx/ptc.conf with the substitutions the module docstring lists, and no other;
    each directive in ``drop`` is removed (nginx's default then holds), only for a test that
    measures what the shipped setting fixes."""
    text = SHIPPED_CONFIG.read_text()
    servers = "".join(f"        server {address};\n" for address in upstreams)
    text = _substitute(text, r"^(?:        server 10\.0\.0\.1\d:50051;\n)+", servers)
    text = _substitute(text, r"^        listen 50051 http2;$", f"        listen {listen} http2;")
    text = _substitute(text, r"^pid \S+;$", f"pid {prefix}/nginx.pid;")
    text = _substitute(text, r"^error_log \S+ warn;$", f"error_log {prefix}/error.log warn;")
    text = _substitute(
        text, r"^    access_log \S+ grpc;$", f"    access_log {prefix}/access.log grpc;"
    )
    for directive in drop:
        text = _substitute(
            text, rf"^        {re.escape(directive)} \S+;$", f"        # {directive}: default"
        )
    for directive, value in (timeouts or {}).items():
        assert directive.endswith("_timeout"), f"{directive}: only timeouts are substituted"
        text = _substitute(
            text, rf"^        {re.escape(directive)} \S+;$", f"        {directive} {value};"
        )
    return text


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _accepting(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def nginx(
    upstreams: Sequence[str],
    *,
    timeouts: Mapping[str, str] | None = None,
    drop: Sequence[str] = (),
) -> Iterator[Balancer]:
    """nginx with the shipped configuration in front of ``upstreams``; stopped (SIGTERM, its
    fast shutdown) and its prefix removed at the end."""
    assert os.access(NGINX, os.X_OK), f"no nginx at {NGINX}: apt-get install nginx-light"
    prefix = Path(tempfile.mkdtemp(prefix="ptc-nginx-"))
    proc: subprocess.Popen[bytes] | None = None
    try:
        for _attempt in range(5):  # the free port may be taken before nginx binds it
            port = _free_port()
            config = render_config(upstreams, f"127.0.0.1:{port}", prefix, timeouts, drop)
            (prefix / "nginx.conf").write_text(config)
            proc = subprocess.Popen(
                [NGINX, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-g", "daemon off;"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            deadline = time.monotonic() + START_TIMEOUT_S
            while proc.poll() is None and not _accepting(port):
                assert time.monotonic() < deadline, "nginx did not start listening"
                time.sleep(0.05)
            if proc.poll() is None:
                break
            assert proc.stderr is not None
            message = proc.stderr.read().decode()
            proc.stderr.close()
            proc = None
            assert "Address already in use" in message, message
        assert proc is not None, "nginx found no free port in 5 attempts"
        yield Balancer(f"127.0.0.1:{port}", prefix, config, proc)
    finally:
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
        shutil.rmtree(prefix, ignore_errors=True)
