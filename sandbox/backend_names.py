"""The names of the backends, stated once: what a request asks for, what a tenant may be allowed,
and what the server builds (`sandbox.backends.factory`). A module of its own, below everything,
because the options and the tenants check a name long before any backend is imported."""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["BACKEND_NAMES", "BackendName"]

BackendName = Literal["process", "docker", "gvisor"]
BACKEND_NAMES: tuple[BackendName, ...] = get_args(BackendName)
