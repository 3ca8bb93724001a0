"""The gRPC service: `SandboxServer` (app), its servicer, the streamed session, host handlers,
the default single-tenant tenancy and in-memory audit store, and the error interceptor."""

# First: the process backend's package turns gRPC's fork handlers off before this server starts
# gRPC (sandbox/backends/process/__init__.py says why).
import sandbox.backends.process  # noqa: F401  # isort: skip
from sandbox.server.app import SandboxServer
from sandbox.server.config import ServerConfig, load_config
from sandbox.server.store_memory import MemoryAuditStore
from sandbox.server.tenancy import SingleTenant

__all__ = ["MemoryAuditStore", "SandboxServer", "ServerConfig", "SingleTenant", "load_config"]
