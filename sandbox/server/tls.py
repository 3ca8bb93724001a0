"""The server's TLS: its certificate and key, the client CAs of mTLS, picked up again on change.

    credentials = server_credentials(ServerTls.from_config(config))   # None: plaintext
    port = server.add_secure_port(listen, credentials)

The certificate chain and key (`tls_cert`, `tls_key`, PEM files) are read at start, where any
fault is a clear `InvalidArgument` naming the file; after that gRPC asks `_Reloader.fetch` at
every new connection's handshake, which re-reads the files when their modification time, size
or inode changed (a renewal by cert-manager or certbot, an atomic rename) and hands gRPC the new
configuration: connections made after a renewal get the new certificate, open connections keep
theirs, and no restart is needed. A renewal caught half-written (a key that does not match the
certificate, a file that does not parse) is not taken: the previous configuration stays, and a
WARNING says why (once per state of the files), until the files agree again.

With `tls_client_ca` every client must present a certificate issued by one of those CAs (mTLS):
a connection without one, or with one from another CA, fails its handshake before any RPC.
`fleet_ca` adds the CA that issues the fleet's servers their client certificates
(`sandbox.server.peers`); it needs `tls_client_ca`, since gRPC only asks for client
certificates when it requires them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from sandbox.errors import InvalidArgument

__all__ = ["ServerTls", "load_certificates", "read_pem", "server_credentials"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerTls:
    cert: str  # PEM: the server's certificate, then any intermediates
    key: str  # PEM: its private key
    client_ca: str | None = None  # PEM bundle: require client certificates issued by these
    fleet_ca: str | None = None  # PEM: the CA of the fleet's servers' client certificates

    @classmethod
    def from_options(
        cls,
        cert: str | None,
        key: str | None,
        client_ca: str | None = None,
        fleet_ca: str | None = None,
    ) -> ServerTls | None:
        """The TLS settings, None for plaintext; a half configuration is refused, naming what
        is missing."""
        if cert is None and key is None:
            for name, value in (("tls_client_ca", client_ca), ("fleet_ca", fleet_ca)):
                if value is not None:
                    raise InvalidArgument(
                        f"{name}: client certificates need TLS; give tls_cert and tls_key too "
                        "(--tls-cert, --tls-key)"
                    )
            return None
        if cert is None or key is None:
            given, missing = ("tls_cert", "tls_key") if key is None else ("tls_key", "tls_cert")
            raise InvalidArgument(
                f"{given}: TLS needs both the certificate and its key; {missing} is not set "
                f"(--{missing.replace('_', '-')})"
            )
        if fleet_ca is not None and client_ca is None:
            raise InvalidArgument(
                "fleet_ca: servers prove who they are with client certificates, which gRPC only "
                "asks for under mTLS; give tls_client_ca too (--tls-client-ca)"
            )
        return cls(cert, key, client_ca, fleet_ca)


def read_pem(name: str, path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise InvalidArgument(f"{name} {path}: {exc.strerror or exc}") from exc


def load_certificates(name: str, path: str, data: bytes | None = None) -> list[x509.Certificate]:
    """The PEM certificates in ``path`` (or in ``data``, read from it); at least one, or an
    error naming the file."""
    try:
        return x509.load_pem_x509_certificates(read_pem(name, path) if data is None else data)
    except ValueError as exc:
        raise InvalidArgument(f"{name} {path}: not a PEM certificate file ({exc})") from exc


def _configuration(tls: ServerTls) -> grpc.ServerCertificateConfiguration:
    """Reads and checks the files; the configuration gRPC serves them with."""
    chain = read_pem("tls_cert", tls.cert)
    key = read_pem("tls_key", tls.key)
    leaf = load_certificates("tls_cert", tls.cert, chain)[0]
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(
            f"tls_key {tls.key}: not an unencrypted PEM private key ({exc})"
        ) from exc
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    encoding = serialization.Encoding.DER
    if private.public_key().public_bytes(encoding, public) != leaf.public_key().public_bytes(
        encoding, public
    ):
        raise InvalidArgument(
            f"tls_key {tls.key}: is not the key of the certificate in tls_cert {tls.cert}"
        )
    roots: bytes | None = None
    if tls.client_ca is not None:
        roots = read_pem("tls_client_ca", tls.client_ca)
        load_certificates("tls_client_ca", tls.client_ca, roots)
        if tls.fleet_ca is not None:
            fleet = read_pem("fleet_ca", tls.fleet_ca)
            load_certificates("fleet_ca", tls.fleet_ca, fleet)
            roots = roots.rstrip(b"\n") + b"\n" + fleet
    return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=roots)


def _stamp(paths: tuple[str | None, ...]) -> tuple[tuple[int, int, int] | None, ...]:
    stamps: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            info = os.stat(path) if path is not None else None
        except OSError:
            info = None
        stamps.append(None if info is None else (info.st_mtime_ns, info.st_size, info.st_ino))
    return tuple(stamps)


class _Reloader:
    """gRPC's certificate configuration fetcher: a new configuration when the files changed."""

    def __init__(self, tls: ServerTls) -> None:
        self.tls = tls
        self._paths = (tls.cert, tls.key, tls.client_ca, tls.fleet_ca)
        self._seen = _stamp(self._paths)
        self._refused: tuple[tuple[int, int, int] | None, ...] = ()
        self.initial = _configuration(tls)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC on each handshake, on one of its threads: cheap when nothing changed
        # (four stat calls), and never raising (gRPC would only log it).
        stamp = _stamp(self._paths)
        if stamp in (self._seen, self._refused):  # unchanged, or already refused (said once)
            return None
        try:
            configuration = _configuration(self.tls)
        except InvalidArgument as exc:
            self._refused = stamp
            log.warning("tls: keeping the previous certificate: %s", exc.message)
            return None
        self._seen = stamp
        log.info("tls: certificate files changed; new connections get the new ones")
        return configuration


def server_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """Credentials that re-read the files when they change; mTLS with ``client_ca``."""
    reloader = _Reloader(tls)
    return grpc.dynamic_ssl_server_credentials(
        reloader.initial,
        reloader.fetch,  # type: ignore[arg-type]  # None is documented: "no change"
        require_client_authentication=tls.client_ca is not None,
    )
