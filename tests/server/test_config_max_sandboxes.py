"""`max_sandboxes` in server.toml: the process backend's cap on sandboxes alive at once, which
the Kubernetes base sizes its memory limit by (deploy/kubernetes/configmap.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.backends.process.backend import ProcessBackend
from sandbox.errors import InvalidArgument
from sandbox.server.app import SandboxServer
from sandbox.server.config import ServerConfig, load_config


def test_max_sandboxes_reaches_the_process_backend(tmp_path: Path) -> None:
    toml = tmp_path / "server.toml"
    toml.write_text("max_sandboxes = 12\n")
    config = load_config(toml)
    assert config.max_sandboxes == 12
    backend = SandboxServer(config).engine.config.backends["process"]
    assert isinstance(backend, ProcessBackend)
    assert backend.config.max_sandboxes == 12
    assert ServerConfig().max_sandboxes == 64  # the backend's own default, unchanged


@pytest.mark.parametrize(
    ("value", "message"),
    [("0", "max_sandboxes must be positive"), ('"12"', "max_sandboxes has the wrong type")],
)
def test_a_bad_max_sandboxes_is_refused_naming_the_key(
    tmp_path: Path, value: str, message: str
) -> None:
    toml = tmp_path / "server.toml"
    toml.write_text(f"max_sandboxes = {value}\n")
    with pytest.raises(InvalidArgument, match=f"config {toml}: {message}"):
        load_config(toml)
