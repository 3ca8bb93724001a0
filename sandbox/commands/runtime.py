"""``ptc runtime build|list|show|rm``: named, immutable Python environments for sandboxes.

``build NAME --requirements FILE [--wheelhouse DIR] [--preload MODULE ...] [--max-bytes N]``
resolves the requirements to a locked, hashed set of wheels (from the package index, or only
from DIR) and installs them into ``$PTC_RUNTIMES_DIR/NAME`` (``--dir`` overrides), for the
guest interpreter (``--python``, default the process backend's). ``list`` prints one line per
runtime, ``show NAME`` its metadata as JSON, ``image NAME`` builds its Docker image (offline, on the
Docker backend's runtime image), ``rm NAME`` removes it. A request names its
runtime with ``ptc run --runtime NAME`` (or the SDK's and the proto's ``runtime``).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from sandbox.runtimes import DEFAULT_MAX_BYTES, RuntimeStore, build_runtime

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "runtime", help="build, list, show and remove runtimes", description=__doc__
    )
    parser.add_argument(
        "--dir", metavar="DIR", help="the runtimes directory (default $PTC_RUNTIMES_DIR)"
    )
    sub = parser.add_subparsers(dest="runtime_command", required=True, metavar="ACTION")
    build = sub.add_parser("build", help="build a runtime from a requirements file")
    build.add_argument("name", metavar="NAME")
    build.add_argument("--requirements", "-r", required=True, metavar="FILE")
    build.add_argument(
        "--wheelhouse", metavar="DIR", help="install only from wheels in DIR (no network)"
    )
    build.add_argument(
        "--preload",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE once per fork server, before forking sandbox (repeatable)",
    )
    build.add_argument(
        "--max-bytes",
        type=int,
        default=DEFAULT_MAX_BYTES,
        metavar="N",
        help=f"refuse a runtime larger than N bytes installed (default {DEFAULT_MAX_BYTES})",
    )
    build.add_argument("--python", metavar="PATH", help="the guest interpreter to build for")
    build.set_defaults(handler=_build)
    lister = sub.add_parser("list", help="list the runtimes")
    lister.set_defaults(handler=_list)
    show = sub.add_parser("show", help="print a runtime's metadata as JSON")
    show.add_argument("name", metavar="NAME")
    show.set_defaults(handler=_show)
    image = sub.add_parser(
        "image", help="build a runtime's Docker image (offline, on the runtime image)"
    )
    image.add_argument("name", metavar="NAME")
    image.add_argument(
        "--image", metavar="BASE", help="the base runtime image (default $PTC_DOCKER_IMAGE)"
    )
    image.set_defaults(handler=_image)
    remove = sub.add_parser("rm", help="remove a runtime")
    remove.add_argument("name", metavar="NAME")
    remove.set_defaults(handler=_remove)


def _store(args: argparse.Namespace) -> RuntimeStore:
    return RuntimeStore(args.dir)


def _build(args: argparse.Namespace) -> int:
    from sandbox.backends.process.backend import default_guest_python

    runtime = build_runtime(
        _store(args),
        args.name,
        args.requirements,
        python=args.python or default_guest_python(),
        wheelhouse=args.wheelhouse,
        preload=args.preload,
        max_bytes=args.max_bytes,
    )
    packages = " ".join(f"{p['name']}=={p['version']}" for p in runtime.packages)
    print(f"{runtime.name}: python {runtime.python}, {runtime.size_bytes} bytes: {packages}")
    return 0


def _list(args: argparse.Namespace) -> int:
    for runtime in _store(args).list():
        packages = " ".join(f"{p['name']}=={p['version']}" for p in runtime.packages)
        print(f"{runtime.name}\tpython {runtime.python}\t{runtime.size_bytes}\t{packages}")
    return 0


def _show(args: argparse.Namespace) -> int:
    print(json.dumps(_store(args).get(args.name).describe(), indent=2))
    return 0


def _image(args: argparse.Namespace) -> int:
    from sandbox.backends.docker import engine_client
    from sandbox.runtimes.docker_image import build_image

    runtime = _store(args).get(args.name)
    client = engine_client.connect(engine_client.engine_address())
    try:
        print(build_image(client, runtime, args.image or engine_client.default_image()))
    finally:
        client.close()
    return 0


def _remove(args: argparse.Namespace) -> int:
    _store(args).remove(args.name)
    return 0
