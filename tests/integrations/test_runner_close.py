"""An embedded runner whose backend never started (a Docker backend with no engine behind it)
still closes: its engine closes the backend and nothing is raised, instead of `close()` stopping
at the missing warm pool and leaving the backend open."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.backends.docker.backend import DockerBackendConfig
from sandbox.backends.factory import build_backend
from sandbox.engine import EngineConfig
from sandbox.errors import Unavailable
from sandbox.integrations import EmbeddedRunner


def test_a_runner_whose_docker_backend_has_no_engine_closes(tmp_path: Path) -> None:
    socket = tmp_path / "no-engine.sock"
    backend = build_backend(
        "docker", DockerBackendConfig(address=f"unix://{socket}", runtime_root=tmp_path)
    )
    runner = EmbeddedRunner(EngineConfig(backends={"docker": backend}, default_backend="docker"))
    with pytest.raises(Unavailable) as down:
        _ = backend.pool  # started, but no pool: the engine never answered
    assert f"no Docker engine answers at unix://{socket}" in down.value.message
    runner.close()
    assert backend._closed
