"""Builds a backend from configuration: the one place that knows each backend name's class and
what the name implies (gVisor is the Docker backend under the OCI runtime runsc).

    build_backend("process", BackendOptions(pool_size=1, allow_degraded=True))
    build_backend("gvisor", BackendOptions(runtimes_dir="/var/lib/ptc/runtimes"))
    build_backends({"process": BackendOptions(pool_size=4), "docker": BackendOptions()})

`BackendOptions` carries what the server, the CLI and the integrations set for any backend;
a caller that needs more of one backend (tests, benchmarks) gives that backend's own typed
config instead (`ProcessBackendConfig`, `DockerBackendConfig`), which the name still completes:
a ``gvisor`` one always runs under runsc and is called ``gvisor``. An unknown name, or a config
of another backend's type, is refused with `InvalidArgument` naming the backends there are.
Importing this module imports neither backend (the Docker one needs the optional SDK).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, overload

from sandbox.backend_names import BACKEND_NAMES, BackendName
from sandbox.errors import InvalidArgument

if TYPE_CHECKING:
    from sandbox.backends.base import Backend
    from sandbox.backends.docker.backend import DockerBackend, DockerBackendConfig
    from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig

__all__ = [
    "BACKEND_NAMES",
    "DOCKER",
    "GVISOR",
    "BackendName",
    "BackendOptions",
    "DockerVariant",
    "build_backend",
    "build_backends",
    "command_backend",
]


@dataclass(frozen=True)
class DockerVariant:
    """What a backend name built on the Docker backend fixes: its name (what requests and
    tenants call it, and what its containers and channel directories are named after) and
    the engine's OCI runtime its containers run under."""

    name: str
    oci_runtime: str


DOCKER = DockerVariant(name="docker", oci_runtime="runc")
# The Docker backend under gVisor's user-space kernel (runsc, registered with the engine:
# scripts/dockerd.sh), offered next to a runc "docker" one in the same server.
GVISOR = DockerVariant(name="gvisor", oci_runtime="runsc")
_DOCKER_VARIANTS = {variant.name: variant for variant in (DOCKER, GVISOR)}


@dataclass(frozen=True)
class BackendOptions:
    """What a caller sets on any backend; None: that backend's default."""

    pool_size: int | None = None  # sandboxes kept warm when quiet
    # The runtimes directory (`sandbox.runtimes`); None: `default_runtimes_dir()`.
    runtimes_dir: str | None = None
    # The process backend only: run with rlimits alone where the host has no cgroups or no
    # seccomp, instead of refusing to start (a container has nothing to degrade).
    allow_degraded: bool = False
    # The process backend only: sandboxes alive at once (idle and running); None: its default.
    max_sandboxes: int | None = None


@overload
def build_backend(
    name: Literal["process"], options: BackendOptions | ProcessBackendConfig | None = None
) -> ProcessBackend: ...


@overload
def build_backend(
    name: Literal["docker", "gvisor"], options: BackendOptions | DockerBackendConfig | None = None
) -> DockerBackend: ...


@overload
def build_backend(
    name: str, options: BackendOptions | ProcessBackendConfig | DockerBackendConfig | None = None
) -> Backend: ...


def build_backend(
    name: str, options: BackendOptions | ProcessBackendConfig | DockerBackendConfig | None = None
) -> Backend:
    """The backend called ``name``, not started, built with ``options`` (see the module)."""
    _check_name(name)
    if name == "process":
        return _process(options)
    return _docker(_DOCKER_VARIANTS[name], options)


def build_backends(config: Mapping[str, BackendOptions]) -> dict[str, Backend]:
    """One backend per name, in the mapping's order; refuses the whole mapping when a name is
    unknown, before any backend is built."""
    for name in config:
        _check_name(name)
    return {name: build_backend(name, options) for name, options in config.items()}


def command_backend(name: str, allow_degraded: bool = False) -> dict[str, Backend]:
    """What one command-line run (`ptc run`, `ptc replay`, `ptc mcp`) builds: backend ``name``
    alone, a process backend with a warm pool of one sandbox, a Docker one at its defaults."""
    pool_size = 1 if name == "process" else None
    return {name: build_backend(name, BackendOptions(pool_size, allow_degraded=allow_degraded))}


def _check_name(name: str) -> None:
    if name not in BACKEND_NAMES:
        known = ", ".join(BACKEND_NAMES)
        raise InvalidArgument(f"backend: unknown backend {name!r} (known: {known})")


def _process(
    options: BackendOptions | ProcessBackendConfig | DockerBackendConfig | None,
) -> Backend:
    from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig

    if options is None or isinstance(options, ProcessBackendConfig):
        return ProcessBackend(options)
    if not isinstance(options, BackendOptions):
        raise _wrong_config("process", options, "ProcessBackendConfig")
    config = ProcessBackendConfig(
        allow_degraded=options.allow_degraded, runtimes_dir=options.runtimes_dir
    )
    if options.pool_size is not None:
        config = dataclasses.replace(config, pool_size=options.pool_size)
    if options.max_sandboxes is not None:
        config = dataclasses.replace(config, max_sandboxes=options.max_sandboxes)
    return ProcessBackend(config)


def _docker(
    variant: DockerVariant,
    options: BackendOptions | ProcessBackendConfig | DockerBackendConfig | None,
) -> Backend:
    from sandbox.backends.docker.backend import DockerBackend, DockerBackendConfig

    if options is None:
        options = BackendOptions()
    if isinstance(options, DockerBackendConfig):
        config = options
    elif isinstance(options, BackendOptions):
        config = DockerBackendConfig(runtimes_dir=options.runtimes_dir)
    else:
        raise _wrong_config(variant.name, options, "DockerBackendConfig")
    config = dataclasses.replace(config, name=variant.name, oci_runtime=variant.oci_runtime)
    if isinstance(options, BackendOptions) and options.pool_size is not None:
        config = dataclasses.replace(config, pool_size=options.pool_size)
    return DockerBackend(config)


def _wrong_config(name: str, options: object, expected: str) -> InvalidArgument:
    return InvalidArgument(
        f"backend {name!r}: takes BackendOptions or a {expected}, not a {type(options).__name__}"
    )
