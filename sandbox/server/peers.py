"""Who may speak as a server: the fleet identity that calls between servers must carry.

A server proves it is a server with a TLS client certificate issued directly by the fleet CA
(`ptc serve --fleet-ca PEM`, under mTLS): the connection's verified peer certificate, which gRPC
puts in the call's auth context after the handshake checked it against the trusted CAs, must be
signed by the fleet CA's key. Nothing a tenant holds grants it: an API key travels in metadata,
which any caller writes, and the auth context comes only from the TLS handshake. So the fleet
CA must issue certificates to servers only (keep it apart from the CA of tenants' client
certificates), and a server's certificate is as secret as its key.

A call that says it was carried from another server (metadata `FORWARDED_BY`, the server's
address) is refused with UNAUTHENTICATED unless its connection is a fleet server's
(`ErrorInterceptor`); no server sends it yet: carrying session calls between servers is not
built, and this is the gate it will pass through.
"""

from __future__ import annotations

from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from sandbox.errors import Unauthenticated
from sandbox.server.tls import load_certificates

__all__ = ["FORWARDED_BY", "FleetIdentity", "peer_certificate"]

FORWARDED_BY = "ptc-forwarded-by"
_PEER_CERT = "x509_pem_cert"


def peer_certificate(context: Any) -> x509.Certificate | None:
    """The client certificate the TLS handshake verified for this call's connection, if any."""
    values = context.auth_context().get(_PEER_CERT) or []
    if not values:
        return None
    try:
        return x509.load_pem_x509_certificate(values[0])
    except ValueError:
        return None


class FleetIdentity:
    """Tells a fleet server's connection from anyone else's."""

    def __init__(self, ca_path: str | None) -> None:
        self.cas = () if ca_path is None else tuple(load_certificates("fleet_ca", ca_path))

    def is_fleet_server(self, context: Any) -> bool:
        """True only for a connection whose verified client certificate the fleet CA issued."""
        cert = peer_certificate(context)
        if cert is None:
            return False
        for ca in self.cas:
            try:
                cert.verify_directly_issued_by(ca)
            except (ValueError, TypeError, InvalidSignature):
                continue
            return True
        return False

    def check_forwarded(self, context: Any) -> None:
        """Refuses a call that claims to come from a server over a connection that is not one."""
        if not self.is_fleet_server(context):
            raise Unauthenticated(
                f"{FORWARDED_BY}: only a fleet server may carry calls between servers, and this "
                "connection has no client certificate issued by the fleet CA (ptc serve "
                "--fleet-ca); an API key cannot stand in for one"
            )
