"""Connecting to the Docker engine and checking that it can run our sandboxes.

The only module that constructs a `docker` client. The engine address comes from
`PTC_DOCKER_HOST`, else `DOCKER_HOST`, else the engine's default socket; the image from
`PTC_DOCKER_IMAGE`, else `DEFAULT_IMAGE` (built by `scripts/build_images.sh`). Every failure
here becomes `sandbox.errors.Unavailable` with a message an operator can act on.
"""

from __future__ import annotations

import hashlib
import os
import socket

import docker
import docker.errors
from docker import DockerClient

from sandbox.errors import Unavailable
from sandbox.guest import GUEST_DIR, GUEST_FILES

__all__ = [
    "DEFAULT_IMAGE",
    "LABEL_GUEST_SHA256",
    "check_image",
    "check_runtime",
    "connect",
    "engine_address",
    "guest_sha256",
]

DEFAULT_IMAGE = "ptc-sandbox-runtime:latest"
DEFAULT_ADDRESS = "unix:///var/run/docker.sock"
LABEL_GUEST_SHA256 = "org.ptc-sandbox.guest-sha256"
API_TIMEOUT_S = 30
# Docker 20.10's API; newer engines serve it too. A fixed version spares the client the
# negotiation round trip, which also leaks its socket when the engine does not answer.
API_VERSION = "1.41"
MAX_POOL_CONNECTIONS = 32


def engine_address() -> str:
    return os.environ.get("PTC_DOCKER_HOST") or os.environ.get("DOCKER_HOST") or DEFAULT_ADDRESS


def default_image() -> str:
    return os.environ.get("PTC_DOCKER_IMAGE") or DEFAULT_IMAGE


def guest_sha256() -> str:
    """Hash of the guest files in GUEST_FILES order (scripts/build_images.sh computes the same)."""
    digest = hashlib.sha256()
    for name in GUEST_FILES:
        digest.update((GUEST_DIR / name).read_bytes())
    return digest.hexdigest()


def _probe_unix_socket(address: str) -> None:
    """Connects once to a unix:// engine address: the SDK leaks its socket when that fails."""
    if not address.startswith("unix://"):
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(API_TIMEOUT_S)
        probe.connect(address.removeprefix("unix://"))


def connect(address: str) -> DockerClient:
    """A client for the engine at ``address`` that has answered a ping."""
    client: DockerClient | None = None
    try:
        _probe_unix_socket(address)
        client = DockerClient(
            base_url=address,
            version=API_VERSION,
            timeout=API_TIMEOUT_S,
            max_pool_size=MAX_POOL_CONNECTIONS,
        )
        client.ping()
    except (docker.errors.DockerException, OSError) as exc:  # requests' errors are OSErrors
        if client is not None:
            client.close()
        raise Unavailable(
            f"docker backend unavailable: no Docker engine answers at {address} ({exc}); "
            "set PTC_DOCKER_HOST or DOCKER_HOST, or start one with scripts/dockerd.sh start"
        ) from exc
    return client


def check_image(client: DockerClient, image: str) -> None:
    """The image exists and carries the guest files this host would send."""
    try:
        labels = client.images.get(image).labels or {}
    except docker.errors.ImageNotFound as exc:
        raise Unavailable(
            f"docker backend unavailable: the runtime image {image} is missing; "
            "build it with scripts/build_images.sh (or set PTC_DOCKER_IMAGE)"
        ) from exc
    except docker.errors.DockerException as exc:
        raise Unavailable(f"docker backend unavailable: inspecting {image} failed: {exc}") from exc
    built_with = labels.get(LABEL_GUEST_SHA256)
    if built_with != guest_sha256():
        raise Unavailable(
            f"docker backend unavailable: the runtime image {image} was built with other guest "
            f"files (label {LABEL_GUEST_SHA256}={built_with!r}); rebuild it with "
            "scripts/build_images.sh"
        )


def check_runtime(client: DockerClient, runtime: str) -> None:
    """The engine has this OCI runtime registered (gVisor's ``runsc`` is not by default)."""
    try:
        runtimes = client.info().get("Runtimes") or {}
    except docker.errors.DockerException as exc:
        raise Unavailable(f"docker backend unavailable: reading the engine's info: {exc}") from exc
    if runtime not in runtimes:
        have = ", ".join(sorted(runtimes)) or "none"
        raise Unavailable(
            f"docker backend unavailable: the engine has no OCI runtime {runtime!r} (have: "
            f"{have}); for gVisor install runsc and register it (scripts/dockerd.sh)"
        )
