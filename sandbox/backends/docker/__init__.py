"""The Docker backend: warm-pooled single-use containers on a Docker engine.

Modules, one mechanism each: `engine_client` (connecting, image checks), `spec` (what a
container is created with), `seccomp_profile` (its syscall filter), `channel` (host sockets
bind-mounted into the container), `cgroup` (reading the kernel's accounting), `oom_watch` (its
out-of-memory notice, acted on at once), `container` (one sandbox's life), `janitor` (leftovers
of a crashed server), `backend` (the `Backend` seam and the pool: `DockerBackend`,
`DockerBackendConfig`, which `sandbox.backends.factory` builds). This
package re-exports nothing, so that importing it, or any of its mechanism modules, imports
neither `backend` nor the `docker` SDK, which only `backend` imports.
"""

__all__: list[str] = []
