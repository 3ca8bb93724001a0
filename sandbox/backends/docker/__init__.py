"""The Docker backend: warm-pooled single-use containers on a Docker engine.

Modules, one mechanism each: `engine_client` (connecting, image checks), `spec` (what a
container is created with), `channel` and `tap` (host sockets bind-mounted into the container),
`cgroup` (reading the kernel's accounting), `container` (one sandbox's life), `janitor`
(leftovers of a crashed server), `backend` (the `Backend` seam and the pool). Importing this
package does not import the `docker` SDK; `backend` does.
"""

__all__ = ["DockerBackend", "DockerBackendConfig"]


def __getattr__(name: str) -> object:
    if name in __all__:
        from sandbox.backends.docker import backend

        return getattr(backend, name)
    raise AttributeError(name)
