"""The Docker backend's life cycle: unavailable without an engine, the janitor, the pool."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox.backends.docker import engine_client
from sandbox.backends.docker.backend import DockerBackend, DockerBackendConfig
from sandbox.backends.docker.janitor import clean_leftovers, owner_dir_name
from sandbox.backends.docker.spec import LABEL_CHANNEL_DIR, LABEL_MANAGED, LABEL_OWNER
from sandbox.engine import Engine, EngineConfig, ExecutionRequest, RunHooks
from sandbox.errors import Unavailable
from sandbox.limits import DEFAULTS

if TYPE_CHECKING:
    from .conftest import DockerHarness


def test_no_engine_means_unavailable_with_a_clear_message(tmp_path: Path) -> None:
    async def scenario() -> str:
        backend = DockerBackend(
            DockerBackendConfig(address=f"unix://{tmp_path}/no-engine.sock", runtime_root=tmp_path)
        )
        async with Engine(
            EngineConfig(backends={"docker": backend}, default_backend="docker")
        ) as engine:
            # The engine (and so a server) starts; executions on this backend are refused.
            with pytest.raises(Unavailable) as caught:
                await engine.execute(ExecutionRequest(script="print(1)", backend="docker"))
            with pytest.raises(Unavailable):
                await backend.acquire(DEFAULTS)
            return caught.value.message

    message = asyncio.run(scenario())
    assert "no Docker engine answers" in message
    assert "no-engine.sock" in message
    assert not list(tmp_path.iterdir())


def test_missing_image_means_unavailable(docker_client: Any, tmp_path: Path) -> None:
    async def scenario() -> str | None:
        backend = DockerBackend(
            DockerBackendConfig(image="ptc-no-such-image:never", runtime_root=tmp_path)
        )
        await backend.start()
        reason = backend.unavailable_reason
        await backend.close()
        return reason

    reason = asyncio.run(scenario())
    assert reason is not None and "ptc-no-such-image:never is missing" in reason
    assert "scripts/build_images.sh" in reason


def test_janitor_removes_what_a_dead_server_left(docker_client: Any, tmp_path: Path) -> None:
    # A pid that exists with another start time stands for a server that died (pid reused).
    dead = ("vm-placeholder", os.getpid(), 1)
    hostname = __import__("socket").gethostname()
    owner = f"{hostname}:{dead[1]}:{dead[2]}"
    leftover_dir = tmp_path / owner_dir_name(dead)
    (leftover_dir / "c1").mkdir(parents=True)
    live_dir = tmp_path / "owner-1-1"  # pid 1 with start time 1 does not match either
    image = engine_client.default_image()
    made = [
        docker_client.containers.create(
            image, ["python3", "-c", "pass"], network_mode="none",
            labels={LABEL_MANAGED: "1", LABEL_OWNER: owner, LABEL_CHANNEL_DIR: str(leftover_dir)},
        ),
        docker_client.containers.create(
            image, ["python3", "-c", "import time; time.sleep(60)"], network_mode="none",
            labels={LABEL_MANAGED: "1", LABEL_OWNER: owner},
        ),
        # Another host's container on a shared engine: never touched.
        docker_client.containers.create(
            image, ["python3", "-c", "pass"], network_mode="none",
            labels={LABEL_MANAGED: "1", LABEL_OWNER: f"elsewhere:{os.getpid()}:1"},
        ),
    ]  # fmt: skip
    made[1].start()
    try:
        removed = clean_leftovers(docker_client, tmp_path)
        assert removed >= 2  # ours, and any other dead server's on this engine
        remaining = {
            c.id
            for c in docker_client.containers.list(
                all=True, filters={"label": LABEL_MANAGED}, ignore_removed=True
            )
        }
        assert made[0].id not in remaining and made[1].id not in remaining
        assert made[2].id in remaining
        assert not leftover_dir.exists()
        assert not live_dir.exists()
    finally:
        for container in made:
            with contextlib.suppress(Exception):
                container.remove(force=True)


def test_pool_hands_out_each_container_once(dclean: DockerHarness) -> None:
    ids = []
    for _ in range(4):
        result = dclean.run("print(open('/proc/sys/kernel/hostname').read().strip())")
        assert result.stdout == "sandbox\n"
        ids.append(result.execution_id)
    # Files written by one execution are not seen by the next: a fresh container each time.
    first = dclean.run("open('/tmp/mark', 'w').write('x'); print('wrote')")
    second = dclean.run("import os; print(os.path.exists('/tmp/mark'))")
    assert (first.stdout, second.stdout) == ("wrote\n", "False\n")


def test_limits_other_than_the_pools_get_their_own_container(dclean: DockerHarness) -> None:
    result = dclean.run(
        "print(open('/sys/fs/cgroup/memory/memory.limit_in_bytes').read().strip()"
        " if __import__('os').path.exists('/sys/fs/cgroup/memory/memory.limit_in_bytes')"
        " else open('/sys/fs/cgroup/memory.max').read().strip())",
        limits={"memory": 200 * 1024 * 1024},
    )
    assert (result.status, result.stdout) == ("ok", f"{200 * 1024 * 1024}\n")


def test_cancel_mid_run_leaves_nothing(dclean: DockerHarness) -> None:
    async def scenario() -> str:
        cancel = asyncio.Event()
        request = ExecutionRequest(script="import time\ntime.sleep(30)", backend="docker")
        task = asyncio.ensure_future(dclean.engine.execute(request, hooks=RunHooks(cancel=cancel)))
        await asyncio.sleep(0.5)
        cancel.set()
        result = await task
        return str(result.status)

    started = time.monotonic()
    assert dclean.call(scenario()) == "cancelled"
    assert time.monotonic() - started < 30
