"""The server's own image (top-level Dockerfile), built offline by `scripts/build_images.sh
--server` (which `scripts/ci_docker.sh up` runs): a container started from it serves gRPC to the
host over loopback — a real health check, an unauthenticated call refused, one Execute with the
API key its first start generated. The test engine (scripts/dockerd.sh) runs with
`--bridge=none`, so nothing can be published with `-p`: the container shares the host's network
and listens on a free loopback port of it, with the tenants file all the same.

The container runs with the privileges the Dockerfile documents for bubblewrap (CAP_SYS_ADMIN, no
seccomp profile, unmasked /proc), and with `--allow-degraded`: on a cgroup v1 engine a
non-privileged container's cgroup filesystem is read-only, so the process backend runs on
rlimits there (the Dockerfile, README and SECURITY.md say so).

The image's default command (no arguments: `serve --listen 0.0.0.0:50051` with a generated
tenants file) is run as an operator would, with `--network none`, and checked from inside the
container with the image's own `ptc`. It gets the last item of the Dockerfile's list, a writable
cgroup filesystem, because without `--allow-degraded` (an argument) the server fails closed on a
read-only one: NOT_SERVING. The host's hierarchy is mounted with the host's cgroup namespace, so
the path /proc/self/cgroup names is the container's own cgroup, under which the server makes its
sandboxes' (and removes them when `docker stop` ends it).
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandbox.backends.process.uid_range import DEFAULT_COUNT, DEFAULT_FIRST
from sandbox.client import Client
from sandbox.errors import Unauthenticated
from tests.server_image import DOCKER, IMAGE, require_image
from tests.server_image import docker as _docker
from tests.server_image import logs as _logs

pytestmark = pytest.mark.requires_docker

RUN_FLAGS = [
    "--cap-add", "SYS_ADMIN",
    "--security-opt", "seccomp=unconfined",
    "--security-opt", "systempaths=unconfined",
]  # fmt: skip


@pytest.fixture
def container() -> Iterator[tuple[str, int]]:
    require_image()
    name = f"ptc-server-test-{uuid.uuid4().hex[:12]}"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = _docker(
        "run", "-d", "--name", name, *RUN_FLAGS, "--network", "host", IMAGE,
        "serve", "--listen", f"127.0.0.1:{port}", "--tenants", "/var/lib/ptc/tenants.toml",
        "--allow-degraded",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        yield name, port
    finally:
        _docker("rm", "-f", name)
    assert name not in _docker("ps", "-a", "--format", "{{.Names}}").stdout.split()


def test_the_server_image_serves_grpc_to_the_host(container: tuple[str, int]) -> None:
    container_name, port = container
    deadline = time.monotonic() + 90
    while f"listening on 127.0.0.1:{port}" not in _logs(container_name):
        state = _docker("inspect", "-f", "{{.State.Running}}", container_name).stdout.strip()
        assert state == "true", _logs(container_name)
        assert time.monotonic() < deadline, _logs(container_name)
        time.sleep(0.2)
    logs = _logs(container_name)
    assert "not serving executions" not in logs, logs
    match = re.search(r"^ptc-server: generated API key: (ptc_\S+)$", logs, re.M)
    assert match, logs
    key = match.group(1)
    target = f"127.0.0.1:{port}"

    with grpc.insecure_channel(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING

    # The client raises the project's error class of the gRPC status, with its message.
    with pytest.raises(Unauthenticated, match="unknown API key"):
        Client(target, api_key="ptc_wrong").execute("print(1)", timeout=60)

    result = Client(target, api_key=key).execute(
        "import os\nprint(6 * 7, os.getuid())\n", timeout=60
    )
    assert str(result.status) == "ok", result
    # The server is root in its container: the sandbox runs as a uid of its own, the one its
    # result names, of the per-sandbox range (was 65534 for all; issue 39).
    uid = int(next(i for i in result.isolation if i.startswith("uid:")).split(":")[1])
    assert uid in range(DEFAULT_FIRST, DEFAULT_FIRST + DEFAULT_COUNT)
    assert result.stdout == f"42 {uid}\n"
    assert result.exit_code == 0


# What the default command needs beyond RUN_FLAGS on an engine that mounts cgroups read-only.
WRITABLE_CGROUPS = ["--cgroupns", "host", "--volume", "/sys/fs/cgroup:/sys/fs/cgroup:rw"]


@pytest.fixture
def default_container() -> Iterator[str]:
    require_image()
    name = f"ptc-server-default-{uuid.uuid4().hex[:12]}"
    started = _docker("run", "-d", "--name", name, *RUN_FLAGS, *WRITABLE_CGROUPS,
                      "--network", "none", IMAGE)  # fmt: skip
    try:
        assert started.returncode == 0, started.stderr
        yield name
        # SIGTERM: the server drains, removes its sandboxes' cgroups and exits 0.
        stopped = _docker("stop", "--time", "30", name, timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        state = _docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip()
        assert state == "0", _logs(name)
    finally:
        _docker("rm", "-f", name)
    assert name not in _docker("ps", "-a", "--format", "{{.Names}}").stdout.split()


def test_the_default_command_serves_with_a_generated_key(default_container: str) -> None:
    name = default_container
    deadline = time.monotonic() + 90
    while "listening on 0.0.0.0:50051" not in _logs(name):
        state = _docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip()
        assert state == "true", _logs(name)  # the default once exited 2 here
        assert time.monotonic() < deadline, _logs(name)
        time.sleep(0.2)
    logs = _logs(name)
    assert "not serving executions" not in logs, logs
    match = re.search(r"^ptc-server: generated API key: (ptc_\S+)$", logs, re.M)
    assert match, logs
    key = match.group(1)
    # The tenants file the first start wrote keeps the key's hash, never the key.
    tenants = _docker("exec", name, "cat", "/var/lib/ptc/tenants.toml")
    assert tenants.returncode == 0, tenants.stderr
    assert 'id = "default"' in tenants.stdout and key not in tenants.stdout

    health = _docker("exec", name, "ptc", "health", "--server", "127.0.0.1:50051")
    assert (health.returncode, health.stdout) == (0, "SERVING\n"), health.stderr + _logs(name)

    run = subprocess.run(
        [DOCKER, "exec", "-i", "--env", f"PTC_API_KEY={key}", name,
         "ptc", "run", "--server", "127.0.0.1:50051", "-"],
        input="print(6 * 7)\n", capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (run.returncode, run.stdout) == (0, "42\n"), run.stderr + _logs(name)
