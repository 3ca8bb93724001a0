"""``ptc stubs MANIFEST [--compact] [--json]``: print the stub module generated for a manifest.

MANIFEST is a path or ``-`` for standard input. Prints the module scripts import as ``tools``,
or its compact prompt form with ``--compact``, or with ``--json`` one JSON object: ``module``,
``compact``, ``names`` (Python name -> tool name), ``warnings`` and ``manifest_hash``. Warnings
go to standard error unless ``--json`` carries them. A bad manifest exits with 2 and one error
line naming the tool and JSON path.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sandbox.commands._manifest_file import read_manifest
from stubs_gen import ManifestError, load_manifest, render_compact, render_module

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "stubs",
        help="print the typed stub module for a tool manifest",
        description="Print the typed stub module (imported by scripts as `tools`) for a manifest.",
    )
    parser.add_argument("manifest", metavar="MANIFEST", help="manifest file, or - for stdin")
    parser.add_argument(
        "--compact", action="store_true", help="print the compact prompt form instead"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: module, compact, names, warnings, manifest_hash",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """The ``stubs`` handler; returns the exit code."""
    source = read_manifest(args.manifest, "MANIFEST")
    origin = "standard input" if args.manifest == "-" else args.manifest
    try:
        manifest = load_manifest(source, origin=origin)
        module = render_module(manifest) if args.json or not args.compact else ""
        compact = render_compact(manifest) if args.json or args.compact else ""
    except ManifestError as exc:
        print(f"ptc stubs: {exc}", file=sys.stderr)
        return 2
    if args.json:
        payload = {
            "module": module,
            "compact": compact,
            "names": manifest.names,
            "warnings": list(manifest.warnings),
            "manifest_hash": manifest.sha256,
        }
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        return 0
    for warning in manifest.warnings:
        print(f"ptc stubs: warning: {warning}", file=sys.stderr)
    sys.stdout.write(compact if args.compact else module)
    return 0
