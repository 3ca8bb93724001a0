"""The `pod` fixture of the variant tests: one variant's container (`k8s_pod.Pod`), ended as the
kubelet ends a pod, and removed whatever the test did."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.k8s_pod import Pod
from tests.deploy.k8s_variants import pod_spec
from tests.server_image import docker, logs, require_image


@contextlib.contextmanager
def running(variant: str, workdir: Path, without: tuple[str, ...] = ()) -> Iterator[Pod]:
    """A variant's pod, made (the caller starts it), then stopped as the kubelet ends a pod
    and removed, whatever happened."""
    require_image()
    made = Pod(variant, workdir, without)
    try:
        yield made
        # As the kubelet ends a pod: SIGTERM, then its grace period. The server drains, removes
        # its sandboxes' cgroups and exits 0.
        grace = pod_spec(made.documents)["terminationGracePeriodSeconds"]
        stopped = docker("stop", "--time", str(grace), made.name, timeout=grace + 30)
        assert stopped.returncode == 0, stopped.stderr
        assert made.state("ExitCode") == "0", logs(made.name)
    finally:
        docker("rm", "-f", "--volumes", made.name)
    assert made.name not in docker("ps", "-a", "--format", "{{.Names}}").stdout.split()


@pytest.fixture
def pod(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pod]:
    """The variant the test is parametrized with (`"base"`, or `"base without --flag"`)."""
    variant, *without = request.param.split(" without ")
    with running(variant, tmp_path, tuple(without)) as made:
        yield made
