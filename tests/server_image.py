"""The server's own image (top-level Dockerfile) as the tests run it: its tag, the Docker CLI on
the test engine, a skip when it is not built, and a container's logs. Shared by
tests/server/test_server_image.py and tests/deploy/test_kubernetes_variants.py."""

from __future__ import annotations

import os
import subprocess

import pytest

__all__ = ["DOCKER", "IMAGE", "docker", "logs", "require_image"]

IMAGE = os.environ.get("PTC_SERVER_IMAGE", "ptc-sandbox-server:latest")
DOCKER = "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else "docker"


def docker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DOCKER, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def require_image() -> None:
    if docker("image", "inspect", IMAGE).returncode != 0:
        pytest.skip(f"{IMAGE} is not built: scripts/build_images.sh --server")


def logs(name: str) -> str:
    found = docker("logs", name)
    return found.stdout + found.stderr
