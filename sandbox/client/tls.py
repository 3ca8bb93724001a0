"""The client's side of TLS: a CA bundle to trust, and a client certificate for mTLS.

Each of ``tls_ca``, ``tls_cert`` and ``tls_key`` is a PEM file's path or its bytes. Giving any of
them makes the channel TLS; ``tls_ca`` unset then trusts the system's CAs (gRPC's bundle). A
client certificate needs its key and the key its certificate.
"""

from __future__ import annotations

import os
from typing import TypedDict

import grpc

from sandbox.errors import InvalidArgument

__all__ = ["PemLike", "TlsFiles", "channel_credentials", "read_pems"]

PemLike = str | os.PathLike[str] | bytes


class TlsFiles(TypedDict, total=False):
    """The TLS keyword arguments of `Client` and `AsyncClient`, for a caller that gathers them
    before making a client (the command line's flags, a runner's ``connect``)."""

    tls_ca: PemLike | None
    tls_cert: PemLike | None
    tls_key: PemLike | None


def _pem(name: str, value: PemLike) -> bytes:
    if isinstance(value, bytes):
        data, where = value, "(bytes)"
    else:
        where = os.fspath(value)
        try:
            with open(where, "rb") as file:
                data = file.read()
        except OSError as exc:
            raise InvalidArgument(f"{name} {where}: {exc.strerror or exc}") from exc
    if b"-----BEGIN " not in data:
        raise InvalidArgument(f"{name} {where}: not PEM (no '-----BEGIN' line)")
    return data


def read_pems(
    tls_ca: PemLike | None, tls_cert: PemLike | None, tls_key: PemLike | None
) -> tuple[bytes | None, bytes | None, bytes | None]:
    """The three as PEM bytes, checked: a half client certificate or a bad file is refused."""
    if (tls_cert is None) != (tls_key is None):
        given, missing = ("tls_cert", "tls_key") if tls_key is None else ("tls_key", "tls_cert")
        raise InvalidArgument(f"{given}: a client certificate needs its key; {missing} is not set")
    return (
        None if tls_ca is None else _pem("tls_ca", tls_ca),
        None if tls_cert is None else _pem("tls_cert", tls_cert),
        None if tls_key is None else _pem("tls_key", tls_key),
    )


def channel_credentials(
    tls_ca: PemLike | None = None, tls_cert: PemLike | None = None, tls_key: PemLike | None = None
) -> grpc.ChannelCredentials | None:
    """TLS credentials for these options; None when none is given (a plaintext channel)."""
    if tls_ca is None and tls_cert is None and tls_key is None:
        return None
    ca, cert, key = read_pems(tls_ca, tls_cert, tls_key)
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )
