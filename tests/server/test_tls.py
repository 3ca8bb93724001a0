"""TLS on a real `ptc serve`, with certificates made in the test (`tls_support`).

A TLS server refuses a plaintext client and serves the SDK and the CLI given its CA bundle;
under mTLS (``--tls-client-ca``) a client without a certificate, or with one from another CA, is
refused at the handshake and one from the clients' CA is served; a call that says it was
carried from another server (``ptc-forwarded-by``) is refused unless its connection presents a
certificate of the fleet CA, whatever API key it carries; a certificate renewed on disk is
served to new connections without a restart (and a renewal caught half-written is not taken);
half configurations are refused with the flag at fault.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from sandbox._proto import sandbox_pb2 as pb
from sandbox._proto import sandbox_pb2_grpc as pb_grpc
from sandbox.client import AsyncClient, Client
from sandbox.client.tls import TlsFiles
from sandbox.errors import InvalidArgument, Unauthenticated, Unavailable
from sandbox.tenants import hash_key
from tests.ptc_cli import run_ptc
from tests.ptc_serve import Serving, ptc_serve
from tests.server.tls_support import Issued, issue, make_ca

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
KEY = "ptc-test-key-tls-0123456789abcdef"
TENANTS = f"""
[[tenant]]
id = "acme"
keys = ["{hash_key(KEY)}"]
backends = ["process"]
"""
FORWARD_REFUSED = (
    "ptc-forwarded-by: only a fleet server may carry calls between servers, and this connection "
    "has no client certificate issued by the fleet CA (ptc serve --fleet-ca); an API key cannot "
    "stand in for one"
)
# Without a fleet CA the fleet's proof is its secret, which an in-memory store keeps to itself.
SECRET_REFUSED = (
    "ptc-forwarded-by: only a fleet server may carry calls between servers, and this call does "
    "not carry the fleet's secret (ptc-fleet-secret); an API key cannot stand in for it"
)


@dataclass(frozen=True)
class Pki:
    ca: Issued  # issues the server's certificate
    server: Issued
    clients_ca: Issued  # mTLS: the tenants' client certificates
    client: Issued
    stranger_ca: Issued  # a CA nobody trusts
    stranger: Issued
    fleet_ca: Issued  # the fleet's servers' client certificates
    fleet_server: Issued
    tenants: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca, clients_ca = make_ca(d, "ptc-test-ca"), make_ca(d, "ptc-test-clients-ca")
    stranger_ca, fleet_ca = make_ca(d, "ptc-test-stranger-ca"), make_ca(d, "ptc-test-fleet-ca")
    tenants = d / "tenants.toml"
    tenants.write_text(TENANTS)
    return Pki(
        ca=ca,
        server=issue(ca, d, "server", server=True),
        clients_ca=clients_ca,
        client=issue(clients_ca, d, "client-acme", server=False),
        stranger_ca=stranger_ca,
        stranger=issue(stranger_ca, d, "client-stranger", server=False),
        fleet_ca=fleet_ca,
        fleet_server=issue(fleet_ca, d, "fleet-server-1", server=False),
        tenants=tenants,
    )


def _serve_args(pki: Pki, *extra: str) -> tuple[str, ...]:
    return ("--audit-db", "memory", "--pool-size", "1", "--tenants", str(pki.tenants),
            "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key), *extra)  # fmt: skip


@pytest.fixture(scope="module")
def tls_server(pki: Pki) -> Iterator[Serving]:
    with ptc_serve(*_serve_args(pki)) as serving:
        yield serving


@pytest.fixture(scope="module")
def mtls_server(pki: Pki) -> Iterator[Serving]:
    extra = ("--tls-client-ca", str(pki.clients_ca.cert), "--fleet-ca", str(pki.fleet_ca.cert))
    with ptc_serve(*_serve_args(pki, *extra)) as serving:
        yield serving


def _ptc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    tls = [k for k in os.environ if k.startswith("PTC_TLS_")]  # only what the test passes
    return run_ptc(
        *args, stdin="print(6 * 7)", env={"PTC_API_KEY": KEY, **(env or {})}, without=tls
    )


def _health(address: str, ca: Path) -> subprocess.CompletedProcess[str]:
    return _ptc("health", "--server", address, "--tls-ca", str(ca), "--timeout", "10")


# -- TLS ---------------------------------------------------------------------------------------


def test_a_plaintext_client_is_refused(tls_server: Serving, pki: Pki) -> None:
    with Client(tls_server.address, KEY) as client, pytest.raises(Unavailable) as caught:
        client.run("print(1)")
    # The handshake never happens: gRPC's own words, naming the address.
    message = caught.value.message
    assert message.startswith("failed to connect to all addresses; last error: UNAVAILABLE: "), (
        message
    )
    assert f"ipv4:{tls_server.address}" in message, message
    plain = _ptc("health", "--server", tls_server.address, "--timeout", "10")
    assert plain.returncode == 12, plain.stderr
    # One line saying why, without gRPC's own log lines.
    assert plain.stderr.startswith(f"ptc health: unavailable: server {tls_server.address}: ")
    assert plain.stderr.count("\n") == 1, plain.stderr
    assert _health(tls_server.address, pki.ca.cert).stdout == "SERVING\n"  # still serving


def test_sdk_with_the_ca_bundle(tls_server: Serving, pki: Pki) -> None:
    with Client(tls_server.address, KEY, tls_ca=str(pki.ca.cert)) as client:
        assert client.run("print(6 * 7)").stdout == "42\n"
    # The bundle's bytes work as its path does.
    with Client(tls_server.address, KEY, tls_ca=pki.ca.cert.read_bytes()) as client:
        assert client.run("print(1)").status == "ok"


def test_async_sdk_with_the_ca_bundle(tls_server: Serving, pki: Pki) -> None:
    async def run() -> str:
        async with AsyncClient(tls_server.address, KEY, tls_ca=pki.ca.cert) as client:
            return (await client.execute("print(6 * 7)")).stdout

    assert asyncio.run(asyncio.wait_for(run(), 60)) == "42\n"


def test_a_server_certificate_from_another_ca_is_not_trusted(tls_server: Serving, pki: Pki) -> None:
    with (
        Client(tls_server.address, KEY, tls_ca=str(pki.stranger_ca.cert)) as client,
        pytest.raises(Unavailable),
    ):
        client.run("print(1)")


def test_cli_with_the_ca_bundle(tls_server: Serving, pki: Pki) -> None:
    done = _ptc("run", "-", "--server", tls_server.address, "--tls-ca", str(pki.ca.cert))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "42\n"
    # ... and from $PTC_TLS_CA, as --api-key from $PTC_API_KEY.
    done = _ptc("session", "list", "--server", tls_server.address,
                env={"PTC_TLS_CA": str(pki.ca.cert)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _health(tls_server.address, pki.ca.cert).stdout == "SERVING\n"
    ready = _ptc("health", "--ready", "--server", tls_server.address, "--tls-ca", str(pki.ca.cert))
    assert ready.stdout in ("SERVING\n", "NOT_SERVING\n"), ready.stderr  # answered over TLS


@pytest.mark.parametrize(
    "command",
    [("run", "-"), ("replay", "0123", "--audit-db", "x.db"), ("mcp",)],
    ids=["run", "replay", "mcp"],
)
def test_cli_tls_flags_need_a_server(pki: Pki, command: tuple[str, ...]) -> None:
    done = _ptc(*command, "--tls-ca", str(pki.ca.cert))
    assert done.returncode == 2, done.stderr
    assert "--tls-ca: TLS is for a server; give --server ADDR too" in done.stderr


def test_a_client_certificate_needs_its_key(tls_server: Serving, pki: Pki) -> None:
    with pytest.raises(InvalidArgument) as caught:
        Client(tls_server.address, KEY, tls_ca=str(pki.ca.cert), tls_cert=str(pki.client.cert))
    assert (
        caught.value.message == "tls_cert: a client certificate needs its key; tls_key is not set"
    )


# -- mTLS and the fleet's identity -------------------------------------------------------------


def _mtls_client(serving: Serving, pki: Pki, cert: Issued | None) -> Client:
    tls: TlsFiles = {"tls_ca": str(pki.ca.cert)}
    if cert is not None:
        tls["tls_cert"], tls["tls_key"] = str(cert.cert), str(cert.key)
    return Client(serving.address, KEY, **tls)


def test_mtls_refuses_a_client_without_a_certificate(mtls_server: Serving, pki: Pki) -> None:
    with _mtls_client(mtls_server, pki, None) as client, pytest.raises(Unavailable):
        client.run("print(1)")


def test_mtls_refuses_a_certificate_from_another_ca(mtls_server: Serving, pki: Pki) -> None:
    with _mtls_client(mtls_server, pki, pki.stranger) as client, pytest.raises(Unavailable):
        client.run("print(1)")
    with _mtls_client(mtls_server, pki, pki.client) as client:  # still serving
        assert client.run("print(1)").status == "ok"


def test_mtls_serves_the_clients_ca_sdk_and_cli(mtls_server: Serving, pki: Pki) -> None:
    with _mtls_client(mtls_server, pki, pki.client) as client:
        assert client.run("print(6 * 7)").stdout == "42\n"
    # A client certificate is not a tenant: the API key still decides who the caller is.
    tls: TlsFiles = {
        "tls_ca": str(pki.ca.cert),
        "tls_cert": str(pki.client.cert),
        "tls_key": str(pki.client.key),
    }
    with (
        Client(mtls_server.address, **tls) as keyless,
        pytest.raises(Unauthenticated),
    ):
        keyless.run("print(1)")
    done = _ptc("run", "-", "--server", mtls_server.address, "--tls-ca", str(pki.ca.cert),
                "--tls-cert", str(pki.client.cert), "--tls-key", str(pki.client.key))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "42\n"


def _forwarded_execute(serving: Serving, pki: Pki, cert: Issued) -> pb.ExecutionResult:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki.ca.cert.read_bytes(),
        private_key=cert.key.read_bytes(),
        certificate_chain=cert.cert.read_bytes(),
    )
    with grpc.secure_channel(serving.address, credentials) as channel:
        stub = pb_grpc.SandboxServiceStub(channel)
        metadata = (("authorization", f"Bearer {KEY}"), ("ptc-forwarded-by", "10.0.0.9:50051"))
        response: pb.ExecutionResult = stub.Execute(
            pb.ExecuteRequest(script="print(6 * 7)"), metadata=metadata, timeout=60
        )
        return response


def test_posing_as_a_forwarding_server_is_refused(mtls_server: Serving, pki: Pki) -> None:
    # A tenant's certificate and a valid API key: a tenant, not a server.
    with pytest.raises(grpc.RpcError) as caught:
        _forwarded_execute(mtls_server, pki, pki.client)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert caught.value.details() == FORWARD_REFUSED
    # A certificate of the fleet CA passes the gate.
    assert _forwarded_execute(mtls_server, pki, pki.fleet_server).stdout == "42\n"


def test_forwarded_calls_are_refused_without_tls(pki: Pki) -> None:
    # Without TLS no connection can be a server's, and no caller knows this one's secret.
    with (
        ptc_serve("--audit-db", "memory", "--pool-size", "1") as serving,
        grpc.insecure_channel(serving.address) as channel,
    ):
        stub = pb_grpc.SandboxServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Execute(
                pb.ExecuteRequest(script="print(1)"),
                metadata=(("ptc-forwarded-by", "10.0.0.9:50051"),),
                timeout=60,
            )
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert caught.value.details() == SECRET_REFUSED
        # The streamed and the session calls go through the same gate.
        stream = stub.ExecuteStream(
            iter([pb.ClientMessage(start=pb.ExecuteRequest(script="print(1)"))]),
            metadata=(("ptc-forwarded-by", "10.0.0.9:50051"),),
            timeout=60,
        )
        with pytest.raises(grpc.RpcError) as caught:
            list(stream)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert caught.value.details() == SECRET_REFUSED
        with pytest.raises(grpc.RpcError) as caught:
            stub.ListSessions(
                pb.ListSessionsRequest(),
                metadata=(("ptc-forwarded-by", "10.0.0.9:50051"),),
                timeout=60,
            )
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert caught.value.details() == SECRET_REFUSED
        reply = stub.Execute(pb.ExecuteRequest(script="print(1)"), timeout=60)
        assert reply.stdout == "1\n"


def test_plaintext_beyond_loopback_is_warned_about(pki: Pki) -> None:
    warning = (
        "listen: 0.0.0.0:0 without TLS: API keys and scripts cross the network in plaintext; "
        "serve TLS (--tls-cert, --tls-key) unless a proxy in front terminates it"
    )
    common = ("--audit-db", "memory", "--pool-size", "1", "--tenants", str(pki.tenants))
    with ptc_serve(*common, "--listen", "0.0.0.0:0") as plain:
        pass
    assert warning in plain.stderr, plain.stderr
    with ptc_serve(*_serve_args(pki), "--listen", "0.0.0.0:0") as tls:
        pass
    assert "without TLS" not in tls.stderr, tls.stderr


# -- renewal on disk ---------------------------------------------------------------------------


def test_a_renewed_certificate_is_served_to_new_connections(pki: Pki, tmp_path: Path) -> None:
    live = tmp_path / "live"
    live.mkdir()
    cert, key = live / "tls.crt", live / "tls.key"
    cert.write_bytes(pki.server.cert.read_bytes())
    key.write_bytes(pki.server.key.read_bytes())
    new_ca = make_ca(tmp_path / "renewed", "ptc-test-renewed-ca")
    renewed = issue(new_ca, tmp_path / "renewed", "server-renewed", server=True)
    with ptc_serve("--audit-db", "memory", "--pool-size", "1", "--tls-cert", str(cert),
                   "--tls-key", str(key)) as serving:  # fmt: skip
        assert _health(serving.address, pki.ca.cert).stdout == "SERVING\n"
        # Half-written: the new certificate beside the old key is not taken.
        _replace(cert, renewed.cert.read_bytes())
        assert _health(serving.address, pki.ca.cert).stdout == "SERVING\n"
        assert _health(serving.address, new_ca.cert).returncode == 12
        # Complete: new connections get the renewed certificate, and only it.
        _replace(key, renewed.key.read_bytes())
        assert _health(serving.address, new_ca.cert).stdout == "SERVING\n"
        assert _health(serving.address, pki.ca.cert).returncode == 12
        plain = _ptc("health", "--server", serving.address, "--timeout", "10")
        assert plain.returncode == 12, plain.stderr
    # Said once, though two handshakes met the half-written pair; failed handshakes (a plaintext
    # client, an untrusted certificate) fill no log.
    refused = f"tls: keeping the previous certificate: tls_key {key}: is not the key of the " \
        f"certificate in tls_cert {cert}"  # fmt: skip
    assert serving.stderr.count(refused) == 1, serving.stderr
    assert "Handshake failed" not in serving.stderr, serving.stderr


def _replace(path: Path, data: bytes) -> None:
    """As a renewal does: a new file renamed over the old one."""
    part = path.with_suffix(".part")
    part.write_bytes(data)
    part.replace(path)


# -- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--tls-cert", "{cert}"),
         "tls_cert: TLS needs both the certificate and its key; tls_key is not set (--tls-key)"),
        (("--tls-key", "{key}"),
         "tls_key: TLS needs both the certificate and its key; tls_cert is not set (--tls-cert)"),
        (("--tls-client-ca", "{ca}"),
         "tls_client_ca: client certificates need TLS; give tls_cert and tls_key too "
         "(--tls-cert, --tls-key)"),
        (("--tls-cert", "{cert}", "--tls-key", "{key}", "--fleet-ca", "{ca}"),
         "fleet_ca: servers prove who they are with client certificates, which gRPC only asks "
         "for under mTLS; give tls_client_ca too (--tls-client-ca)"),
        (("--tls-cert", "{cert}", "--tls-key", "{other_key}"),
         "tls_key {other_key}: is not the key of the certificate in tls_cert {cert}"),
        (("--tls-cert", "{key}", "--tls-key", "{key}"),
         "tls_cert {key}: not a PEM certificate file"),
        (("--tls-cert", "{cert}", "--tls-key", "/nonexistent/tls.key"),
         "tls_key /nonexistent/tls.key: No such file or directory"),
        (("--tls-cert", "{cert}", "--tls-key", "{key}", "--fleet-cert", "{cert}"),
         "fleet_cert: the fleet certificate needs its key; fleet_key is not set (--fleet-key)"),
        (("--fleet-cert", "{cert}", "--fleet-key", "{key}"),
         "fleet_cert: the fleet's certificates need TLS; give tls_cert and tls_key too "
         "(--tls-cert, --tls-key)"),
        (("--fleet-peer-ca", "{ca}"),
         "fleet_peer_ca: the fleet's certificates need TLS; give tls_cert and tls_key too "
         "(--tls-cert, --tls-key)"),
        (("--tls-cert", "{cert}", "--tls-key", "{key}", "--fleet-cert", "{key}",
          "--fleet-key", "{key}"),
         "fleet_cert {key}: not a PEM certificate file"),
    ],
    ids=["cert-only", "key-only", "client-ca-only", "fleet-ca-without-mtls", "wrong-key",
         "not-a-cert", "missing-key", "fleet-cert-without-key", "fleet-cert-without-tls",
         "fleet-peer-ca-without-tls", "fleet-cert-not-a-cert"],
)  # fmt: skip
def test_half_or_bad_configurations_are_refused(
    pki: Pki, args: tuple[str, ...], message: str
) -> None:
    paths = {"cert": pki.server.cert, "key": pki.server.key, "ca": pki.ca.cert,
             "other_key": pki.client.key}  # fmt: skip
    argv = [a.format(**paths) for a in args]
    done = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "serve", "--listen", "127.0.0.1:0", "--audit-db", "memory",
         "--pool-size", "1", *argv],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert message.format(**paths) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_mcp_and_replay_through_mtls(mtls_server: Serving, pki: Pki) -> None:
    """`ptc mcp --server` and `ptc replay --server` present the client certificate too."""
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp import types as mcp_types

    tls = ("--tls-ca", str(pki.ca.cert), "--tls-cert", str(pki.client.cert),
           "--tls-key", str(pki.client.key))  # fmt: skip
    params = StdioServerParameters(
        command=PYTHON,
        args=["-m", "sandbox.cli", "mcp", "--server", mtls_server.address, "--api-key", KEY, *tls],
        cwd=str(ROOT),
    )

    async def work() -> Any:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await session.call_tool("execute_python", {"code": "print(6 * 7)"})

    called = asyncio.run(asyncio.wait_for(work(), 100))
    assert isinstance(called, mcp_types.CallToolResult)
    text = "\n".join(b.text for b in called.content if isinstance(b, mcp_types.TextContent))
    assert not called.is_error, text
    assert text == "status: ok · exit code 0 · 0 tool calls\n--- stdout ---\n42", text

    with _mtls_client(mtls_server, pki, pki.client) as client:
        execution_id = client.run("print(6 * 7)").execution_id
    done = _ptc("replay", execution_id, "--server", mtls_server.address, "--json", *tls)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["identical"] is True, done.stdout


def test_server_config_reads_the_tls_keys(tmp_path: Path) -> None:
    from sandbox.server import load_config

    path = tmp_path / "server.toml"
    path.write_text(
        'tls_cert = "/etc/ptc/tls.crt"\ntls_key = "/etc/ptc/tls.key"\n'
        'tls_client_ca = "/etc/ptc/clients.pem"\nfleet_ca = "/etc/ptc/fleet.pem"\n'
        'fleet_cert = "/etc/ptc/f.crt"\nfleet_key = "/etc/ptc/f.key"\n'
        'fleet_peer_ca = "/etc/ptc/ca.pem"\nadvertise = "ptc-1.internal:50051"\n'
    )
    config = load_config(path)
    assert (config.tls_cert, config.tls_key, config.tls_client_ca, config.fleet_ca) == (
        "/etc/ptc/tls.crt", "/etc/ptc/tls.key", "/etc/ptc/clients.pem", "/etc/ptc/fleet.pem",
    )  # fmt: skip
    assert (config.fleet_cert, config.fleet_key, config.fleet_peer_ca, config.advertise) == (
        "/etc/ptc/f.crt", "/etc/ptc/f.key", "/etc/ptc/ca.pem", "ptc-1.internal:50051",
    )  # fmt: skip
    path.write_text("tls_cert = 1\n")
    with pytest.raises(InvalidArgument) as refused:
        load_config(path)
    assert str(refused.value) == f"config {path}: tls_cert has the wrong type"
