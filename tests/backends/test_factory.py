"""`sandbox.backends.factory`: each backend name builds its backend with the options given (the
gVisor one under runsc, whatever config it is handed), an unknown name or a config of another
backend is refused with a clear error, and each backend declares its `Capabilities`. Nothing is
started: building a backend touches no engine and no host."""

from __future__ import annotations

import pytest

from sandbox.backends.base import Capabilities
from sandbox.backends.docker.backend import DockerBackend, DockerBackendConfig
from sandbox.backends.docker.spec import container_capabilities
from sandbox.backends.factory import (
    BackendOptions,
    build_backend,
    build_backends,
    command_backend,
)
from sandbox.backends.fake import FakeBackend
from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig
from sandbox.backends.process.sandbox import process_capabilities
from sandbox.errors import InvalidArgument

UNKNOWN = "backend: unknown backend 'firecracker' (known: process, docker, gvisor)"


def test_process_takes_the_common_options() -> None:
    backend = build_backend(
        "process", BackendOptions(pool_size=5, runtimes_dir="/srv/rt", allow_degraded=True)
    )
    assert isinstance(backend, ProcessBackend)
    assert backend.name == "process"
    assert backend.config == ProcessBackendConfig(
        pool_size=5, runtimes_dir="/srv/rt", allow_degraded=True
    )


def test_unset_options_keep_each_backends_defaults() -> None:
    assert build_backend("process").config == ProcessBackendConfig()
    assert build_backend("process", BackendOptions()).config == ProcessBackendConfig()
    assert build_backend("docker", BackendOptions()).config == DockerBackendConfig()


def test_docker_runs_under_runc() -> None:
    backend = build_backend("docker", BackendOptions(pool_size=3, runtimes_dir="/srv/rt"))
    assert isinstance(backend, DockerBackend)
    assert (backend.name, backend.config.oci_runtime) == ("docker", "runc")
    assert (backend.config.pool_size, backend.config.runtimes_dir) == (3, "/srv/rt")
    assert backend.isolation()[-1] == "oci-runtime:runc"


@pytest.mark.parametrize(
    "options",
    [
        pytest.param(BackendOptions(pool_size=1, runtimes_dir="/srv/rt"), id="options"),
        # A full config keeps its own settings, and the name still decides runtime and name.
        pytest.param(DockerBackendConfig(pool_size=1, runtimes_dir="/srv/rt"), id="config"),
    ],
)
def test_gvisor_is_docker_under_runsc(options: BackendOptions | DockerBackendConfig) -> None:
    backend = build_backend("gvisor", options)
    assert isinstance(backend, DockerBackend)
    assert (backend.name, backend.config.name, backend.config.oci_runtime) == (
        "gvisor",
        "gvisor",
        "runsc",
    )
    assert (backend.config.pool_size, backend.config.runtimes_dir) == (1, "/srv/rt")
    assert backend.isolation()[-1] == "oci-runtime:runsc"
    # Its own channel directories, apart from a runc backend's in the same server.
    assert backend.runtime_root.name == "gvisor"


def test_an_unknown_name_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(InvalidArgument) as refused:
        build_backend("firecracker")
    assert refused.value.message == UNKNOWN


def test_a_mapping_with_an_unknown_name_builds_nothing() -> None:
    with pytest.raises(InvalidArgument) as refused:
        build_backends({"process": BackendOptions(), "firecracker": BackendOptions()})
    assert refused.value.message == UNKNOWN


@pytest.mark.parametrize(
    ("name", "config", "message"),
    [
        (
            "process",
            DockerBackendConfig(),
            "backend 'process': takes BackendOptions or a ProcessBackendConfig, "
            "not a DockerBackendConfig",
        ),
        (
            "gvisor",
            ProcessBackendConfig(),
            "backend 'gvisor': takes BackendOptions or a DockerBackendConfig, "
            "not a ProcessBackendConfig",
        ),
    ],
)
def test_another_backends_config_is_refused(
    name: str, config: ProcessBackendConfig | DockerBackendConfig, message: str
) -> None:
    with pytest.raises(InvalidArgument) as refused:
        build_backend(name, config)
    assert refused.value.message == message


def test_build_backends_keeps_names_and_order() -> None:
    backends = build_backends(
        {
            "process": BackendOptions(pool_size=4),
            "gvisor": BackendOptions(),
            "docker": BackendOptions(),
        }
    )
    assert list(backends) == ["process", "gvisor", "docker"]
    assert [b.name for b in backends.values()] == ["process", "gvisor", "docker"]


def test_a_command_line_run_keeps_one_process_sandbox_warm() -> None:
    (process,) = command_backend("process", allow_degraded=True).values()
    assert isinstance(process, ProcessBackend)
    assert (process.config.pool_size, process.config.allow_degraded) == (1, True)
    (gvisor,) = command_backend("gvisor").values()
    assert isinstance(gvisor, DockerBackend)
    assert (gvisor.name, gvisor.config.pool_size) == ("gvisor", DockerBackendConfig().pool_size)


def test_capabilities_each_backend_declares() -> None:
    cgroups = Capabilities(cgroup_cpu=True, cgroup_pids=True, cgroup_memory=True, runtimes=True)
    # The process backend's sandboxes: all three cgroups where the host has them; without, the
    # host's own sums (unless turned off), never both.
    assert process_capabilities(True) == cgroups
    assert process_capabilities(True, host_accounting=True) == cgroups
    hosted = Capabilities(host_accounting=True, runtimes=True)
    assert process_capabilities(False) == hosted
    assert process_capabilities(False, host_accounting=False) == Capabilities(runtimes=True)
    assert build_backend("process").capabilities == hosted  # not started: no cgroups yet
    # runc: the container's cgroups; its CPU figure only where the host can read the cgroup.
    assert build_backend("docker").capabilities == cgroups
    assert container_capabilities("runc", cgroup_readable=False) == Capabilities(
        cgroup_pids=True, cgroup_memory=True, runtimes=True
    )
    # runsc: the pids cgroup counts gVisor's own threads too, and gVisor delivers an init's
    # own signals.
    assert build_backend("gvisor").capabilities == Capabilities(
        cgroup_cpu=True, cgroup_memory=True, own_signals_delivered=True, runtimes=True
    )
    # The fake: nothing observed by a cgroup, no runtimes, no pool.
    fake = FakeBackend()
    assert (fake.capabilities, fake.pool) == (Capabilities(), None)
    with pytest.raises(InvalidArgument) as refused:
        fake.check_runtime("np")
    assert refused.value.message == "runtime: the process backend does not support runtimes"
