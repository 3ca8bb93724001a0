"""The `ptc` command line: one sub-command per module in `sandbox.commands`."""

from __future__ import annotations

import os

# Before anything imports gRPC: see sandbox/backends/process/__init__.py.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import argparse
import sys
from collections.abc import Sequence

from sandbox.commands import COMMANDS
from sandbox.errors import InvalidArgument, PtcError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ptc", description="Sandboxed execution for programmatic tool calling."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
    except PtcError as exc:
        # A bad request's message already names the field; other classes say what they are.
        kind = "" if isinstance(exc, InvalidArgument) else f"{exc.label}: "
        print(f"ptc {args.command}: {kind}{exc.message}", file=sys.stderr)
        return exc.exit_code  # the table in sandbox/errors.py
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    raise SystemExit(main())
