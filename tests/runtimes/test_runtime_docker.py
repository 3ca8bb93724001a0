"""Runtimes on the Docker backend, under runc and under runsc (gVisor): the runtime's image is
built offline on the runtime image (`ptc runtime image`), numpy computes in it, a numpy
allocation over the memory limit is a `memory` violation, the runtime is read-only, and a
runtime without an image is refused before any container is taken."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.engine import ExecutionRequest
from sandbox.errors import NotFound
from sandbox.limits import parse_limit_args
from sandbox.result import ExecutionResult
from tests.ptc_serve import ptc_serve
from tests.runtimes.runtime_support import PYTHON, ROOT, ptc

pytestmark = pytest.mark.requires_docker

NUMPY_SCRIPT = "import numpy as np\nprint(int(np.dot([1, 2, 3], [4, 5, 6])), np.ones(3).tolist())\n"


def _docker_module() -> Any:
    name = "ptc_tests_docker_harness_runtimes"
    spec = importlib.util.spec_from_file_location(
        name, ROOT / "tests" / "backends" / "docker" / "conftest.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def images(runtimes_dir: Path, runtimes_env: dict[str, str]) -> Iterator[str]:
    from sandbox.backends.docker import engine_client

    done = ptc("runtime", "--dir", str(runtimes_dir), "image", "np", env=runtimes_env)
    assert done.returncode == 0, done.stderr
    tag = done.stdout.strip()
    assert tag.startswith("ptc-runtime-np:"), tag
    yield tag
    client = engine_client.connect(engine_client.engine_address())
    try:
        client.images.remove(tag, force=True)
    finally:
        client.close()


@pytest.fixture(
    scope="module",
    params=["runc", pytest.param("runsc", marks=pytest.mark.requires_gvisor)],
)
def docker(request: pytest.FixtureRequest, runtimes_dir: Path, images: str) -> Iterator[Any]:
    config = {"backend": "gvisor"} if request.param == "runsc" else {}
    harness = _docker_module().DockerHarness(pool_size=1, runtimes_dir=str(runtimes_dir), **config)
    yield harness
    harness.close()
    left = harness.our_containers()
    assert left == [], [c.name for c in left]


def _run(harness: Any, script: str, runtime: str | None, **limits: object) -> ExecutionResult:
    request = ExecutionRequest(
        script=script,
        backend=harness.backend.name,
        runtime=runtime,
        limits=parse_limit_args(f"{k}={v}" for k, v in limits.items()),
    )
    result: ExecutionResult = harness.call(harness.engine.execute(request))
    return result


def test_numpy_computes(docker: Any) -> None:
    result = _run(docker, NUMPY_SCRIPT, "np")
    assert (result.status, result.stdout, result.stderr) == ("ok", "32 [1.0, 1.0, 1.0]\n", "")
    runtime = "runsc" if docker.backend.name == "gvisor" else "runc"
    assert f"oci-runtime:{runtime}" in result.isolation
    assert result.isolation[-1] == "runtime:np"
    plain = _run(docker, "import numpy", None)
    assert plain.error is not None and plain.error.type == "ModuleNotFoundError"
    docker.assert_healthy()


def test_numpy_over_the_memory_limit(docker: Any) -> None:
    limit = 128 * 1024 * 1024
    result = _run(docker, "import numpy as np\na = np.ones(64 * 1024 * 1024)\n", "np", memory=limit)
    assert result.status == "limit_exceeded", result.to_json()
    assert [(v.limit, v.limit_value, v.evidence) for v in result.violations] == [
        ("memory", limit, "kernel")
    ]
    docker.assert_healthy()


def test_the_runtime_is_read_only(docker: Any) -> None:
    script = """
import numpy, os
for path in ("/ptc-runtime/site/evil.py", numpy.__file__):
    try:
        open(path, "a").write("pwned")
        print("written")
    except OSError as exc:
        print(errno.errorcode[exc.errno])
"""
    result = _run(docker, "import errno\n" + script, "np")
    # A new file: the read-only root (EROFS); an existing one is root's (EACCES). gVisor checks
    # the permission first for both.
    new = "EACCES" if docker.backend.name == "gvisor" else "EROFS"
    assert (result.status, result.stdout) == ("ok", f"{new}\nEACCES\n")


def test_runtime_without_image_is_refused(docker: Any, runtimes_dir: Path) -> None:
    with pytest.raises(NotFound) as caught:
        _run(docker, "print(1)", "pure")
    assert caught.value.message.startswith("runtime: 'pure' has no Docker image ptc-runtime-pure:")
    assert caught.value.message.endswith("; build it with `ptc runtime image pure`")
    with pytest.raises(NotFound):
        _run(docker, "print(1)", "nope")
    docker.assert_healthy()


@pytest.mark.requires_gvisor
def test_cli_runs_numpy_under_gvisor(runtimes_env: dict[str, str], images: str) -> None:
    done = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "run", "-", "--backend", "gvisor", "--runtime", "np",
         "--json"],
        input=NUMPY_SCRIPT, capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
        env=runtimes_env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["status"], result["stdout"], result["backend"]) == (
        "ok",
        "32 [1.0, 1.0, 1.0]\n",
        "gvisor",
    )
    assert {"oci-runtime:runsc", "gvisor", "runtime:np"} <= set(result["isolation"])


def test_a_session_in_a_runtime_on_docker(runtimes_env: dict[str, str], images: str) -> None:
    """Through a real `ptc serve --docker`: the session's container is the runtime's image, and
    numpy state lives from one cell to the next."""
    from sandbox.client import Client

    with (
        ptc_serve("--pool-size", "1", "--audit-db", "memory", "--docker", env=runtimes_env) as s,
        Client(s.address) as client,
        client.session(backend="docker", runtime="np") as session,
    ):
        first = session.execute("import numpy as np\na = np.ones(3)")
        second = session.execute("a += 1\na.tolist()")
    assert (first.status, second.status, second.value) == ("ok", "ok", "[2.0, 2.0, 2.0]")
    assert second.isolation[-1] == "runtime:np"
    assert "oci-runtime:runc" in second.isolation
