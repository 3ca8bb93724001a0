"""PTC Sandbox: run model-written Python that calls typed tool stubs, in a resource-limited
sandbox, with every tool call validated, dispatched and recorded on the host."""

import os as _os

# Set before anything imports grpc (sandbox.errors does): the process backend forks (then execs
# bwrap) while gRPC's threads run, and gRPC's fork handlers, on by default, then restart gRPC's
# poller in the child and break the sandbox's start-up. The child execs at once and never uses
# gRPC. An operator's explicit setting wins.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

__all__: list[str] = []
