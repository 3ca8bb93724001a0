"""``ptc tenants check CONFIG`` and ``ptc tenants hash-key [KEY|-] [--scrypt]``.

``check`` validates a tenants file and prints one line per tenant; a bad file exits with 2 and
one error line naming the tenant and the key path. ``hash-key`` prints the hash to put in a
tenant's ``keys``: of KEY, of standard input with ``-``, or of a freshly generated key (printed
first, on its own line, since it is shown only this once).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sandbox.limits import LIMIT_SPECS
from sandbox.tenants.config import TenantConfigError, load_tenants
from sandbox.tenants.keys import hash_key, new_key

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "tenants", help="check a tenants file, hash API keys", description=__doc__
    )
    sub = parser.add_subparsers(dest="tenants_command", required=True, metavar="ACTION")
    check = sub.add_parser("check", help="validate a tenants file")
    check.add_argument("config", metavar="CONFIG", help="the tenants TOML file")
    check.set_defaults(handler=_check)
    hasher = sub.add_parser("hash-key", help="print the hash of an API key for a tenants file")
    hasher.add_argument(
        "key", nargs="?", metavar="KEY", help="the key, or - for stdin (default: generate one)"
    )
    hasher.add_argument(
        "--scrypt", action="store_true", help="salted scrypt instead of sha256 (for chosen keys)"
    )
    hasher.set_defaults(handler=_hash_key)


def _check(args: argparse.Namespace) -> int:
    try:
        tenants = load_tenants(args.config)
    except TenantConfigError as exc:
        print(f"ptc tenants check: {exc.message}", file=sys.stderr)
        return 2
    for config in tenants.tenants:
        tenant = config.tenant
        ceilings = " ".join(
            f"{spec.name}={tenant.ceilings.human(spec.name):g}" for spec in LIMIT_SPECS
        )
        print(
            f"{tenant.id}: {len(config.keys)} key(s), max_concurrent={tenant.max_concurrent}, "
            f"queue={tenant.queue}, rate={tenant.rate_per_minute}/min, "
            f"backends={','.join(sorted(tenant.backends))}, "
            f"ceiling_policy={tenant.ceiling_policy}, ceilings: {ceilings}"
        )
    print(f"ok: {len(tenants.tenants)} tenant(s)")
    return 0


def _hash_key(args: argparse.Namespace) -> int:
    if args.key is None:
        key = new_key()
        print(key)
    elif args.key == "-":
        key = sys.stdin.readline().rstrip("\r\n")
    else:
        key = args.key
    if not key:
        print("ptc tenants hash-key: empty key", file=sys.stderr)
        return 2
    print(hash_key(key, "scrypt" if args.scrypt else "sha256"))
    return 0
