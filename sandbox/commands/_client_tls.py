"""``--tls-ca``, ``--tls-cert``, ``--tls-key``: how every command that talks to a server reaches
one that serves TLS (``ptc serve --tls-cert``), and presents a client certificate under mTLS.

Each defaults to its environment variable (``PTC_TLS_CA``, ``PTC_TLS_CERT``, ``PTC_TLS_KEY``), as
``--api-key`` defaults to ``PTC_API_KEY``; giving any of them makes the connection TLS.
"""

from __future__ import annotations

import argparse
import os

from sandbox.client.tls import TlsFiles

__all__ = ["ENV", "add_tls_options", "given", "tls_options"]

ENV = {"tls_ca": "PTC_TLS_CA", "tls_cert": "PTC_TLS_CERT", "tls_key": "PTC_TLS_KEY"}


def add_tls_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tls-ca",
        metavar="PEM",
        help="connect over TLS, trusting the CAs in this bundle (default $PTC_TLS_CA)",
    )
    parser.add_argument(
        "--tls-cert",
        metavar="PEM",
        help="client certificate for a server that requires one (mTLS; default $PTC_TLS_CERT)",
    )
    parser.add_argument(
        "--tls-key", metavar="PEM", help="the key of --tls-cert (default $PTC_TLS_KEY)"
    )


def given(args: argparse.Namespace) -> list[str]:
    """The TLS flags given on the command line (not from the environment)."""
    return [f"--{name.replace('_', '-')}" for name in ENV if getattr(args, name, None)]


def tls_options(args: argparse.Namespace) -> TlsFiles:
    """Keyword arguments for `Client` / `AsyncClient`: each flag, else its variable."""

    def value(name: str) -> str | None:
        return getattr(args, name, None) or os.environ.get(ENV[name]) or None

    return TlsFiles(tls_ca=value("tls_ca"), tls_cert=value("tls_cert"), tls_key=value("tls_key"))
