"""The `ptc` command line: one sub-command per module in `sandbox.commands`."""

from __future__ import annotations

import os

# Before anything imports gRPC: see sandbox/backends/process/__init__.py.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
# gRPC logs every failed TLS handshake (a plaintext client, a certificate from another CA) as an
# INFO line on stderr: anyone who can connect to `ptc serve` could fill its log, and a client
# command's stderr would carry them. Its errors still show; GRPC_VERBOSITY=INFO shows the rest.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import argparse
import contextlib
import errno
import sys
from collections.abc import Sequence

from sandbox.commands import COMMANDS
from sandbox.errors import InvalidArgument, PtcError, ResourceExhausted


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ptc", description="Sandboxed execution for programmatic tool calling."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser


# A reader that went away (`ptc ... | head`) ends the command quietly with this code, as
# SIGPIPE ends other command-line tools (the shell's 128 + 13).
EXIT_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
        sys.stdout.flush()  # here, where a closed pipe can still be told from a failure
    except BrokenPipeError:
        _discard_output()
        return EXIT_BROKEN_PIPE
    except PtcError as exc:
        # A bad request's message already names the field; other classes say what they are.
        kind = "" if isinstance(exc, InvalidArgument) else f"{exc.label}: "
        print(f"ptc {args.command}: {kind}{exc.message}", file=sys.stderr)
        return exc.exit_code  # the table in sandbox/errors.py
    except KeyboardInterrupt:
        return 130
    except (RuntimeError, OSError, BaseExceptionGroup) as exc:
        why = host_refusal(exc)
        if why is None:
            raise
        print(f"ptc {args.command}: {ResourceExhausted.label}: {why}", file=sys.stderr)
        return ResourceExhausted.exit_code
    return code


def host_refusal(exc: BaseException) -> str | None:
    """What the host refused when ``exc`` is the host running out of threads or processes for
    this command itself (its RLIMIT_NPROC, a pids cgroup, or memory for a thread's stack), else
    None. Such a failure can surface from any thread pool or subprocess start (asyncio's default
    executor, the fork server's start); it is the host's state, not a bug, so it ends the command
    with one line and the resource-exhausted exit code, never a traceback."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (why := host_refusal(inner)) is not None:
                return why
        return None
    if isinstance(exc, RuntimeError) and str(exc).startswith("can't start new thread"):
        return (
            "the host could not start a thread for this command (can't start new thread): its"
            " process and thread limit (RLIMIT_NPROC, a pids cgroup) or its memory is used up"
        )
    if isinstance(exc, OSError) and exc.errno == errno.EAGAIN and not str(exc.filename or ""):
        return (
            f"the host could not start a process for this command ({exc.strerror}): its process"
            " and thread limit (RLIMIT_NPROC, a pids cgroup) or its memory is used up"
        )
    return None


def _discard_output() -> None:
    """Points stdout and stderr at /dev/null, so that the interpreter's last flush at exit
    (of what is still buffered for the closed pipe) fails neither loudly nor with a traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            os.dup2(devnull, stream.fileno())
    os.close(devnull)


if __name__ == "__main__":
    raise SystemExit(main())
