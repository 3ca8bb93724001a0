"""Who may speak as a server: the fleet identity that calls between servers must carry.

A call that says it was carried from another server (metadata `FORWARDED_BY`, the forwarding
server's address) is refused with UNAUTHENTICATED unless it proves it comes from a server of the
fleet (`ErrorInterceptor`, before its method runs). There are two proofs, and a server accepts
exactly one of them:

- **certificate** (a server started with `ptc serve --fleet-ca PEM`, under mTLS): the
  connection's verified client certificate, which gRPC puts in the call's auth context after the
  handshake checked it, must be signed by the fleet CA's key. Nothing a tenant holds grants it:
  an API key travels in metadata, which any caller writes, and the auth context comes only from
  the TLS handshake. So the fleet CA must issue certificates to servers only (keep it apart from
  the CA of tenants' client certificates), and a server's certificate is as secret as its key.
  The secret below is then refused, whatever it says.
- **secret** (every other server): metadata `FLEET_SECRET` equal to the fleet's shared secret,
  created once at random in the shared audit store (`AuditStore.fleet_secret`) and read by every
  member at start, compared in constant time. Without TLS it travels in clear, like the API
  keys: it is for a private network only (SECURITY.md). The in-memory store's secret is known
  to its own process alone, so such a server accepts no forwarded call.

`outgoing_metadata` is what a forwarding server adds to the caller's own credential: who
forwards, and the secret when that is the fleet's proof (a certificate travels in the
handshake instead, `sandbox.server.forwarding`).
"""

from __future__ import annotations

import hmac
from typing import Any

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from sandbox.errors import InvalidArgument, Unauthenticated
from sandbox.server.tls import load_certificates, read_pem

__all__ = [
    "FLEET_SECRET",
    "FORWARDED_BY",
    "HOLDER_ANSWER",
    "FleetIdentity",
    "outgoing_credentials",
    "peer_certificate",
]

FORWARDED_BY = "ptc-forwarded-by"
FLEET_SECRET = "ptc-fleet-secret"  # noqa: S105  -- the metadata key, not a secret
# Trailing metadata on every error a server answers to a carried call: the forwarder passes such
# an error on unchanged, and knows an error without it for the transport's (`forwarding`).
HOLDER_ANSWER = "ptc-holder-answer"
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
    """Tells a fleet server's call from anyone else's (the module docstring says how)."""

    def __init__(self, ca_path: str | None, secret: str | None = None) -> None:
        self.cas = () if ca_path is None else tuple(load_certificates("fleet_ca", ca_path))
        self.secret = secret  # the fleet's shared secret; unused when a fleet CA is set

    @property
    def uses_certificates(self) -> bool:
        return bool(self.cas)

    def is_fleet_server(self, context: Any) -> bool:
        """True only for a call that proves it comes from a server of the fleet."""
        if self.cas:
            return self._certified(context)
        return self._knows_secret(context)

    def _certified(self, context: Any) -> bool:
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

    def _knows_secret(self, context: Any) -> bool:
        if not self.secret:
            return False
        sent = [str(v) for k, v in context.invocation_metadata() or () if k == FLEET_SECRET]
        # One value, equal in constant time: a wrong secret's timing says nothing about it.
        return len(sent) == 1 and hmac.compare_digest(sent[0].encode(), self.secret.encode())

    def outgoing_metadata(self, own_address: str) -> tuple[tuple[str, str], ...]:
        """What a call this server carries to another adds to the caller's credential."""
        pairs = [(FORWARDED_BY, own_address)]
        if not self.cas and self.secret:
            pairs.append((FLEET_SECRET, self.secret))
        return tuple(pairs)

    def check_forwarded(self, context: Any) -> None:
        """Refuses a call that claims to come from a server and cannot prove it."""
        if self.is_fleet_server(context):
            return
        if self.cas:
            raise Unauthenticated(
                f"{FORWARDED_BY}: only a fleet server may carry calls between servers, and this "
                "connection has no client certificate issued by the fleet CA (ptc serve "
                "--fleet-ca); an API key cannot stand in for one"
            )
        raise Unauthenticated(
            f"{FORWARDED_BY}: only a fleet server may carry calls between servers, and this "
            f"call does not carry the fleet's secret ({FLEET_SECRET}); an API key cannot stand "
            "in for it"
        )


def outgoing_credentials(
    tls: bool, fleet_cert: str | None, fleet_key: str | None, peer_ca: str | None
) -> grpc.ChannelCredentials | None:
    """The channel credentials this server calls the others with: None for a plaintext fleet;
    under TLS, trust ``peer_ca`` (None: the system's CAs) and present the fleet certificate."""
    if (fleet_cert is None) != (fleet_key is None):
        given, missing = (
            ("fleet_cert", "fleet_key") if fleet_key is None else ("fleet_key", "fleet_cert")
        )
        raise InvalidArgument(
            f"{given}: the fleet certificate needs its key; {missing} is not set "
            f"(--{missing.replace('_', '-')})"
        )
    if not tls:
        for name, value in (("fleet_cert", fleet_cert), ("fleet_peer_ca", peer_ca)):
            if value is not None:
                raise InvalidArgument(
                    f"{name}: the fleet's certificates need TLS; give tls_cert and tls_key too "
                    "(--tls-cert, --tls-key)"
                )
        return None
    pair: tuple[bytes | None, bytes | None] = (None, None)
    if fleet_cert is not None and fleet_key is not None:
        load_certificates("fleet_cert", fleet_cert)
        pair = (read_pem("fleet_key", fleet_key), read_pem("fleet_cert", fleet_cert))
    return grpc.ssl_channel_credentials(
        root_certificates=None if peer_ca is None else read_pem("fleet_peer_ca", peer_ca),
        private_key=pair[0],
        certificate_chain=pair[1],
    )
