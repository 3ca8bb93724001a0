"""A real `ptc serve` subprocess on an ephemeral loopback port, for the tests that drive the
server as users do: started, its addresses read from the lines it prints first, and stopped
with SIGTERM however the test ends. A clean stop is part of every such test: exit code 0 and no
traceback on stderr (checked only when the test's own body passed, so its failure is the one
reported)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from tests.ptc_cli import PYTHON, ROOT

__all__ = [
    "PYTHON",
    "ROOT",
    "Serving",
    "ptc_serve",
    "start_serve",
    "stop_serve",
]  # the first two: tests.ptc_cli's


_AUDIT_DIRS: dict[int, str] = {}  # a server's own audit directory, by its pid, until stopped


@dataclass
class Serving:
    address: str  # the gRPC listener, host:port
    pid: int
    metrics_address: str | None = None  # with --metrics-listen
    stderr: str = ""  # all the server wrote there, once it has stopped


def start_serve(
    *args: str, env: Mapping[str, str] | None = None, wrapper: Sequence[str] = ()
) -> tuple[subprocess.Popen[str], Serving]:
    """``ptc serve --listen 127.0.0.1:0 *args`` (``env``: its whole environment, None: this
    process's), returned once it listens, with its addresses. The caller stops it, with
    `stop_serve` or on purpose otherwise (a kill -9); `ptc_serve` does both for a plain test.
    ``wrapper`` is a command that ends by exec'ing its arguments (e.g. into a cgroup).
    Without ``--audit-db`` (or ``--config``) the audit is a SQLite file in a directory of its
    own, removed by `stop_serve`: the default, ``./ptc-audit.db``, was the checkout's, and every
    such server shared it and left it behind."""
    if not any(arg.startswith(("--audit-db", "--config")) for arg in args):
        audit_dir = tempfile.mkdtemp(prefix="ptc-test-serve-audit-")
        args = ("--audit-db", f"{audit_dir}/audit.db", *args)
    else:
        audit_dir = None
    proc = subprocess.Popen(
        [*wrapper, PYTHON, "-m", "sandbox.cli", "serve", "--listen", "127.0.0.1:0", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=None if env is None else dict(env),
    )
    assert proc.stdout is not None and proc.stderr is not None
    if audit_dir is not None:
        _AUDIT_DIRS[proc.pid] = audit_dir
    serving = Serving("", proc.pid)
    try:
        line = proc.stdout.readline()
        if line.startswith("metrics on "):
            serving.metrics_address = line.split()[-1]
            line = proc.stdout.readline()
    except BaseException:  # e.g. the test's timeout while the server never said it listens
        proc.kill()
        stop_serve(proc, read=False)
        raise
    if not line.startswith("listening on "):
        proc.kill()
        raise AssertionError(f"ptc serve did not start: {line!r} {stop_serve(proc)}")
    serving.address = line.split()[-1]
    return proc, serving


def stop_serve(proc: subprocess.Popen[str], timeout_s: float = 30.0, *, read: bool = True) -> str:
    """SIGTERM (SIGKILL only as the backstop of a hung server), reaped; its standard error
    (``read=False``: not read, for a server killed on purpose whose children may still hold
    the pipe: reading would wait for them). Stopping a stopped server again returns ""."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait()
    stderr = proc.stderr.read() if proc.stderr and not proc.stderr.closed and read else ""
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    audit_dir = _AUDIT_DIRS.pop(proc.pid, None)
    if audit_dir is not None:
        shutil.rmtree(audit_dir, ignore_errors=True)
    return stderr


@contextlib.contextmanager
def ptc_serve(
    *args: str,
    env: Mapping[str, str] | None = None,
    stop_timeout_s: float = 60.0,
    wrapper: Sequence[str] = (),
) -> Iterator[Serving]:
    """``ptc serve --listen 127.0.0.1:0 *args``, yielding its addresses; stopped on exit."""
    proc, serving = start_serve(*args, env=env, wrapper=wrapper)
    hung = False
    try:
        yield serving
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            code = proc.wait(timeout=stop_timeout_s)
        except subprocess.TimeoutExpired:
            # A stop that never ends: what it waits on goes to its stderr (`kill -USR1`), then
            # it is killed, so that it fails this test alone and leaves nothing to the next.
            hung = True
            proc.send_signal(signal.SIGUSR1)
            time.sleep(1.0)
            proc.kill()
            code = proc.wait()
        serving.stderr = stop_serve(proc)
    assert not hung, f"ptc serve did not stop within {stop_timeout_s} s:\n{serving.stderr}"
    assert code == 0, serving.stderr
    assert "Traceback" not in serving.stderr, serving.stderr
