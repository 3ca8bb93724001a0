"""``ptc session create | show ID | list | close ID``: sessions on a `ptc serve` server.

    id=$(ptc session create --server 127.0.0.1:50051 --tools tools.json --idle-timeout 300)
    ptc run step1.py --server 127.0.0.1:50051 --session "$id"
    ptc run step2.py --server 127.0.0.1:50051 --session "$id" --json
    ptc session close "$id" --server 127.0.0.1:50051

`create` prints the new session's id (its whole description with ``--json``); `show`, `list`
and `close` print JSON. Times are in seconds; ``--limit`` sets the whole session's limits
(``memory``, ``processes``, ``file_size``, ``open_files``, and ``cpu_time`` as its total CPU).
Errors exit as every `ptc` command does (8 not found, 14 failed precondition: a session that
is busy or was lost, ...).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any

from sandbox.commands._client_tls import add_tls_options, tls_options
from sandbox.errors import InvalidArgument
from sandbox.limits import parse_limit_args

if TYPE_CHECKING:
    from sandbox.client import SessionInfo

__all__ = ["check_cell_limits", "register"]


def _client(args: argparse.Namespace) -> Any:
    from sandbox.client import Client

    return Client(args.server, args.api_key, **tls_options(args))


def _server_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        metavar="ADDR",
        default=os.environ.get("PTC_SERVER"),
        required=os.environ.get("PTC_SERVER") is None,
        help="the `ptc serve` server (host:port; default $PTC_SERVER)",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("PTC_API_KEY"),
        help="API key (default $PTC_API_KEY)",
    )
    add_tls_options(parser)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "session", help="create, show, list and close sessions on a server", description=__doc__
    )
    sub = parser.add_subparsers(dest="session_command", required=True)
    create = sub.add_parser("create", help="open a session; prints its id")
    _server_options(create)
    create.add_argument("--tools", metavar="MANIFEST", help="tool manifest (JSON file)")
    create.add_argument("--backend", choices=["process", "docker", "gvisor"], default=None)
    create.add_argument(
        "--limit", action="append", default=[], metavar="NAME=VALUE", help="a session limit"
    )
    create.add_argument("--idle-timeout", type=float, metavar="S", help="seconds idle")
    create.add_argument("--max-lifetime", type=float, metavar="S", help="seconds in all")
    create.add_argument("--max-executions", type=int, metavar="N")
    create.add_argument(
        "--runtime", metavar="NAME", help="the runtime every cell runs in (`ptc runtime list`)"
    )
    create.add_argument("--json", action="store_true", help="print the session as JSON")
    create.set_defaults(handler=_create)
    for name, handler, text in (
        ("show", _show, "one session, open or ended"),
        ("close", _close, "end a session"),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument("session_id", metavar="ID")
        _server_options(command)
        command.set_defaults(handler=handler)
    listing = sub.add_parser("list", help="this tenant's sessions")
    _server_options(listing)
    listing.add_argument("--all", action="store_true", help="also ended sessions still known")
    listing.set_defaults(handler=_list)


def _print(info: SessionInfo) -> None:
    print(json.dumps(info.to_json(), sort_keys=True))


def _create(args: argparse.Namespace) -> int:
    from sandbox.commands._manifest_file import read_manifest

    manifest = read_manifest(args.tools) if args.tools else "[]"
    with _client(args) as client:
        session = client.session(
            manifest,
            limits=parse_limit_args(args.limit),
            backend=args.backend,
            idle_timeout=args.idle_timeout,
            max_lifetime=args.max_lifetime,
            max_executions=args.max_executions,
            runtime=args.runtime,
        )
        info = session.create()
    if args.json:
        _print(info)
    else:
        print(info.session_id)
    return 0


def _show(args: argparse.Namespace) -> int:
    with _client(args) as client:
        _print(client.session(session_id=args.session_id).get())
    return 0


def _close(args: argparse.Namespace) -> int:
    with _client(args) as client:
        _print(client.session(session_id=args.session_id).close())
    return 0


def _list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        for info in client.list_sessions(include_ended=args.all):
            _print(info)
    return 0


# Limits of a session's whole sandbox, set by `ptc session create --limit`, not per cell.
_SESSION_LIMITS = ("memory", "processes", "file_size", "open_files")


def check_cell_limits(items: list[str]) -> None:
    """Refuses a ``--limit`` of the session's whole sandbox on a cell, naming it."""
    for item in items:
        name = item.partition("=")[0].strip()
        if name in _SESSION_LIMITS:
            raise InvalidArgument(
                f"--limit {name}: a session's {name} is set for its whole sandbox by `ptc "
                "session create --limit`, not per cell (per cell: wall_time, cpu_time, "
                "stdout_bytes, stderr_bytes, max_tool_calls, ...)"
            )
