"""Runtimes: named, immutable Python environments with third-party packages.

`store` owns the runtimes directory (names, metadata, removal, checks before use); `build`
resolves and installs one. Backends mount a runtime's tree read-only (process) or run an image
built on it (Docker); requests name their runtime, tenants list the ones they may use.
"""

from sandbox.runtimes.build import DEFAULT_MAX_BYTES, build_runtime, guest_python_version
from sandbox.runtimes.store import (
    DEFAULT_RUNTIME,
    MOUNT_POINT,
    Runtime,
    RuntimeStore,
    default_runtimes_dir,
    validate_name,
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_RUNTIME",
    "MOUNT_POINT",
    "Runtime",
    "RuntimeStore",
    "build_runtime",
    "default_runtimes_dir",
    "guest_python_version",
    "validate_name",
]
